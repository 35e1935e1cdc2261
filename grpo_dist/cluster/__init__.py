"""Ray glue only: actor wrappers, resource checks, sharded dispatch."""
