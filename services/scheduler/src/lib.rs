//! scheduler (being written)
