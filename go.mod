module github.com/hcomm-dev/hcomm

go 1.26.0

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
