//! The bexpr filter language used by `?filter=` and resolver subsets.
