//! Resource sources for hapwright.
//!
//! A source watches one kind of input (manifest files on disk, Kubernetes objects) and
//! publishes `ResourceIndexUpdated` and `ResourceSyncComplete` events on the bus. The
//! sources share the snapshot and `indexBy` machinery of [`hapwright_eventbus::model`].
