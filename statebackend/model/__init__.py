"""The checkpoint model: manifests, file entries, completed-checkpoint records, path
rules, format versions and state schemas. Pure values and functions; imports nothing of
the project but errors."""
