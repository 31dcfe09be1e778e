//! risk-assessor (being written)
