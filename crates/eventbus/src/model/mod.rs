//! Model types carried inside events: resource snapshots with their indexes, rendered
//! configurations with their source maps, deployment outcomes and structured errors.
//!
//! Every type here is immutable once published and cheap to clone (`Arc` inside or a
//! persistent structure), so handing it from one component to the next never copies
//! the payload.

mod deploy;
mod diagnostic;
pub mod haproxy;
mod object;
mod path;
mod rendered;
mod snapshot;

pub use deploy::{DeployReason, DeployStrategy, InstanceDriver, InstanceRef, ReloadReason};
pub use diagnostic::{Diagnostic, Severity, SourceLocation};
pub use object::{IndexedObject, StoredObject};
pub use path::{FieldPath, FieldPathError};
pub use rendered::{
    ContentHash, DigestResume, FileDigest, FileGroup, FileKind, HashedMain, LineOrigin,
    RenderSummary, RenderedConfig, RenderedConfigBuilder, RenderedFileRef, SourceMap, same_file,
    same_files, same_text,
};
pub use snapshot::{LookupError, ObjectKey, ResourceChange, ResourceSnapshot, UpsertOutcome};
