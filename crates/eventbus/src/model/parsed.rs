//! The parsed form of a validated configuration, carried next to it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// The validator's parsed model of a rendered `haproxy.cfg`, handed on with the
/// validated config so that the scheduler and the deployer never parse it again.
///
/// The model type lives in the deployer crate, which the event catalogue cannot
/// name (crate dependencies point from the components to the bus), so the slot
/// holds it behind `Any`; [`ParsedConfig::get`] gives it back typed. An empty slot
/// (tests, or a config that was validated elsewhere) makes the reader parse it
/// itself.
#[derive(Clone, Default)]
pub struct ParsedConfig(Option<Arc<dyn Any + Send + Sync>>);

impl ParsedConfig {
    /// An empty slot.
    pub fn none() -> Self {
        Self(None)
    }

    /// A slot holding `model`.
    pub fn new<T: Any + Send + Sync>(model: Arc<T>) -> Self {
        Self(Some(model))
    }

    /// The model, when the slot holds one of type `T`.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.0.clone()?.downcast::<T>().ok()
    }

    /// Whether the slot holds a model.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

impl fmt::Debug for ParsedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "ParsedConfig(..)"
        } else {
            "ParsedConfig(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_back_the_model_of_its_type_only() {
        let slot = ParsedConfig::new(Arc::new(42_u32));
        assert_eq!(slot.get::<u32>().as_deref(), Some(&42));
        assert!(slot.get::<String>().is_none());
        assert!(!ParsedConfig::none().is_some());
    }
}
