//! docker-executor (being written)
