//! Config entries: decode, normalize, validate.
