//! Consul-shaped domain types and their JSON, in one place.

pub mod config_entry;
