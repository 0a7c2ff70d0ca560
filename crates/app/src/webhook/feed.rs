//! The current objects, as the webhook sees them: a component on the bus keeps the
//! latest snapshot of every watched resource, exactly as the renderer does, so each
//! review starts from what the next reconciliation would render.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use hapwright_eventbus::model::ResourceSnapshot;
use hapwright_eventbus::{Component, ComponentError, Context, EventKind, EventPayload, Interest};
use hapwright_reconciler::Resources;

/// The latest snapshots and their template view.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// The renderer's view of every resource (converted once per change).
    pub resources: Resources,
    /// The latest snapshot of every resource, to apply a reviewed object to.
    pub snapshots: BTreeMap<Arc<str>, Arc<ResourceSnapshot>>,
    /// Resources whose source finished its initial listing.
    pub synced: BTreeSet<Arc<str>>,
}

/// The state shared between the feed component (one per controller iteration) and
/// the webhook's requests. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Current(Arc<Mutex<State>>);

impl Current {
    /// Nothing loaded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the state now (cheap: persistent structures and `Arc`s).
    pub fn get(&self) -> State {
        self.lock().clone()
    }

    /// Applies one resource update.
    pub fn update(
        &self,
        source: &Arc<str>,
        snapshot: Arc<ResourceSnapshot>,
        change: Option<&hapwright_eventbus::model::ResourceChange>,
    ) {
        let mut state = self.lock();
        state.resources.update(source, snapshot.clone(), change);
        state.snapshots.insert(source.clone(), snapshot);
    }

    /// Records that `source` finished its initial listing.
    pub fn synced(&self, source: &Arc<str>) {
        self.lock().synced.insert(source.clone());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Feeds [`Current`] from `ResourceIndexUpdated` and `ResourceSyncComplete`.
#[derive(Debug)]
pub struct Feed {
    current: Current,
}

impl Feed {
    /// The component's name.
    pub const NAME: &'static str = "webhook";

    /// A feed into `current`.
    pub fn new(current: Current) -> Self {
        Self { current }
    }
}

#[async_trait::async_trait]
impl Component for Feed {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn consumes(&self) -> Interest {
        Interest::pipeline(
            [
                EventKind::ResourceIndexUpdated,
                EventKind::ResourceSyncComplete,
            ]
            .as_slice(),
        )
    }

    async fn run(self: Box<Self>, mut ctx: Context) -> Result<(), ComponentError> {
        ctx.health().healthy();
        while let Some(event) = ctx.next_event().await {
            match &event.payload {
                EventPayload::ResourceIndexUpdated(update) => self.current.update(
                    &update.source,
                    update.snapshot.clone(),
                    Some(&update.change),
                ),
                EventPayload::ResourceSyncComplete(done) => self.current.synced(&done.source),
                _ => {}
            }
        }
        Ok(())
    }
}
