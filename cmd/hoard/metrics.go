package main

import (
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/metrics"
)

// metricsFlag adds --metrics to a long-running command.
func metricsFlag(f *pflag.FlagSet, addr *string) {
	f.StringVar(addr, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics (a bare port is on loopback; default: off)")
}

// endpoint is a process's metrics listener and registry, opened before
// the process starts its work (a bad address changes nothing) and served
// once what it measures exists. A nil endpoint (no --metrics) does
// nothing.
type endpoint struct {
	l   net.Listener
	reg *prometheus.Registry
}

// openMetrics opens --metrics addr ("": none).
func openMetrics(addr string) (*endpoint, error) {
	if addr == "" {
		return nil, nil
	}
	l, err := metrics.Listen(addr)
	if err != nil {
		return nil, usageError{err}
	}
	return &endpoint{l: l, reg: metrics.Registry()}, nil
}

// start serves the metrics registered so far, and says where.
func (e *endpoint) start(name string) (stop func()) {
	if e == nil {
		return func() {}
	}
	stop = metrics.Serve(e.l, e.reg)
	fmt.Fprintf(os.Stderr, "hoard %s: metrics at http://%s/metrics\n", name, e.l.Addr())
	return stop
}

// close gives the address back when the process ends before start.
func (e *endpoint) close() {
	if e != nil {
		e.l.Close()
	}
}
