package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// serveMetrics serves /metrics on o.MetricsAddr for the run, from a registry
// of its own that the communicators report into. It returns the function
// that stops the server (and waits for it).
func serveMetrics(o Options, cfg *hcomm.Config, stderr io.Writer, getenv func(string) string, scrape func(url string)) (stop func(), err error) {
	if o.MetricsAddr == "" {
		return func() {}, nil
	}
	addr, err := metricsAddr(o, getenv)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Metrics = reg
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "hcomm bench: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "hcomm bench: serving metrics on http://%s/metrics\n", ln.Addr())
	return func() {
		if scrape != nil {
			scrape("http://" + ln.Addr().String() + "/metrics")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}, nil
}

// metricsAddr is --metrics-addr, with the port moved up by the local rank
// when this process is one rank of a launch: ranks on one host do not
// collide, rank r serving on port+r.
func metricsAddr(o Options, getenv func(string) string) (string, error) {
	if _, ok := hcomm.Launched(getenv); !ok || o.RanksSet {
		return o.MetricsAddr, nil
	}
	host, port, err := net.SplitHostPort(o.MetricsAddr)
	if err != nil {
		return "", fmt.Errorf("--metrics-addr: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return o.MetricsAddr, nil // a service name or 0: as given
	}
	for _, v := range []string{"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"} {
		if lr, err := strconv.Atoi(getenv(v)); err == nil && lr >= 0 {
			return net.JoinHostPort(host, strconv.Itoa(p+lr)), nil
		}
	}
	return o.MetricsAddr, nil
}
