module github.com/hcomm-dev/hcomm

go 1.26.0

require golang.org/x/sys v0.49.0

require golang.org/x/sync v0.24.0
