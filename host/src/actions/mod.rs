//! Actions client.
