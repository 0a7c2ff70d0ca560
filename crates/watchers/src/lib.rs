//! Resource sources for hapwright.
//!
//! A source watches one kind of input (manifest files on disk, Kubernetes objects) and
//! publishes `ResourceIndexUpdated` and `ResourceSyncComplete` events on the bus. The
//! sources share the snapshot and `indexBy` machinery of [`hapwright_eventbus::model`].
//!
//! # Layout
//!
//! - [`config`]: the `watchedResources` config section ([`Config`]).
//! - [`yaml`]: YAML/JSON parsing under input budgets, with located errors; also used
//!   by the app to load the controller's config file.
//! - [`manifest`]: one manifest file → keyed, filtered objects.
//! - [`filewatch`]: watching files and directories with notify, surviving ConfigMap
//!   symlink swaps and editor save patterns, plus a periodic rescan.
//! - [`files`]: the `files` source component ([`FilesSource`]).
//! - [`http`]: the `http` source ([`HttpSource`]): a document fetched at an
//!   interval, its objects pending until a validation accepts them.
//! - [`kubernetes`]: the Kubernetes client, the `kubernetes` source
//!   ([`KubernetesSource`]), HAProxy pod discovery and leader election.

pub mod config;
pub mod files;
pub mod filewatch;
pub mod http;
pub mod kubernetes;
pub mod manifest;
pub mod yaml;

pub use config::Config;
pub use files::FilesSource;
pub use http::HttpSource;
pub use kubernetes::KubernetesSource;
