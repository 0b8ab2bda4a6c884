module profilerd-tests/go_allocs

go 1.26.0
