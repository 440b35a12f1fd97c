//! The discovery chain compiler.
