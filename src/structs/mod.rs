//! Consul-shaped domain types and their JSON, in one place.
