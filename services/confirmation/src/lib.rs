//! confirmation (being written)
