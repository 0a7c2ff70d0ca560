//! The reconciliation pipeline of hapwright: the debouncer that batches resource
//! changes, the executor that runs one reconciliation at a time, and the Jinja template
//! renderer that turns resource snapshots into HAProxy configuration files.
