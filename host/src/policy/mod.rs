//! Policy engine.
