//! Workspace-level examples and tests live in examples/ and tests/.
