//! workspace-store (being written)
