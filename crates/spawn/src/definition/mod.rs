//! Agent definitions: built-ins, Markdown files with YAML frontmatter, and the registry.
