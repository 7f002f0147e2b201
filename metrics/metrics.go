// Package metrics serves a hoard process's Prometheus metrics: its
// client's cache and protocol counters (a mount, a proxy), its server's
// load and requests (a server, a proxy), and Go's runtime. Names follow
// Prometheus's conventions: hoard_ and the part, units in the name,
// _total on counters.
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/latency"
	"github.com/hoardfs/hoard/proxystore"
	"github.com/hoardfs/hoard/server"
)

// Listen opens the address of flag (--metrics, --http): host:port, or a
// bare port (or :port), which is taken on loopback, so that metrics are
// not served to the network unless asked. Its errors name flag.
func Listen(flag, addr string) (net.Listener, error) {
	full, err := Address(flag, addr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", full)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("%s %s: the address is in use", flag, addr)
	case err != nil:
		return nil, fmt.Errorf("%s %s: %v", flag, addr, unwrapOp(err))
	}
	return l, nil
}

// Address is the host:port Listen takes addr for: a bare port is on
// loopback. Its error names flag.
func Address(flag, addr string) (string, error) {
	hp := addr
	if !strings.Contains(hp, ":") {
		hp = ":" + hp
	}
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", fmt.Errorf("%s %s: want HOST:PORT or PORT", flag, addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Err
	}
	return err
}

// Registry is a registry with Go's runtime and the process's metrics.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Serve serves reg's metrics at /metrics on l, and other (if not nil) at
// every other path, until stop.
func Serve(l net.Listener, reg *prometheus.Registry, other http.Handler) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if other != nil {
		mux.Handle("/", other)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return func() { srv.Close() }
}

// GRPC counts a server's requests by method and code, with their
// handling times (the go-grpc-middleware's standard grpc_server_*
// metrics); its interceptors go first in the server's chains.
func GRPC(reg *prometheus.Registry) *grpcprom.ServerMetrics {
	m := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30})))
	reg.MustRegister(m)
	return m
}

// metric is one metric a collector reads off a snapshot of type S.
type metric[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) float64
}

// emitter is a metric a collector reads off a snapshot of type S that is
// not one number: labelled values, a histogram.
type emitter[S any] struct {
	desc *prometheus.Desc
	emit func(S, *prometheus.Desc, chan<- prometheus.Metric)
}

// snapshots is a collector that takes one snapshot per scrape and reads
// every metric off it.
type snapshots[S any] struct {
	take     func() S
	metrics  []metric[S]
	emitters []emitter[S]
}

func (c *snapshots[S]) addEmitter(desc *prometheus.Desc, emit func(S, *prometheus.Desc, chan<- prometheus.Metric)) {
	c.emitters = append(c.emitters, emitter[S]{desc, emit})
}

// addLatency adds a histogram of the Latency value reads off a snapshot.
func (c *snapshots[S]) addLatency(name, help string, value func(S) latency.Histogram) {
	c.addEmitter(prometheus.NewDesc(name, help, nil, nil), func(s S, d *prometheus.Desc, ch chan<- prometheus.Metric) {
		l := value(s)
		buckets := make(map[float64]uint64, len(latency.Bounds))
		var below uint64
		for i, b := range latency.Bounds {
			if i < len(l.Counts) {
				below += l.Counts[i]
			}
			buckets[b] = below
		}
		ch <- prometheus.MustNewConstHistogram(d, l.Count, l.Sum.Seconds(), buckets)
	})
}

func (c *snapshots[S]) add(name, help string, kind prometheus.ValueType, value func(S) float64) {
	c.metrics = append(c.metrics, metric[S]{prometheus.NewDesc(name, help, nil, nil), kind, value})
}

func (c *snapshots[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
	for _, e := range c.emitters {
		ch <- e.desc
	}
}

func (c *snapshots[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.take()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s))
	}
	for _, e := range c.emitters {
		e.emit(s, e.desc, ch)
	}
}

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
)

// Client registers the metrics of a client (a mount's, a proxy's):
// stats is its Stats.
func Client(reg *prometheus.Registry, stats func() client.Stats) {
	c := &snapshots[client.Stats]{take: stats}
	f := func(v int64) float64 { return float64(v) }
	c.add("hoard_cache_hits_total", "Reads served from the cache.", counter, func(s client.Stats) float64 { return f(s.Hits) })
	c.add("hoard_cache_misses_total", "Reads that had to fetch from the server.", counter, func(s client.Stats) float64 { return f(s.Misses) })
	c.add("hoard_cache_fetched_bytes_total", "Bytes fetched from servers.", counter, func(s client.Stats) float64 { return f(s.BytesFetched) })
	c.add("hoard_cache_written_bytes_total", "Bytes written into the cache's store: fetched chunks and local writes.", counter, func(s client.Stats) float64 { return f(s.BytesWritten) })
	c.add("hoard_cache_bytes", "Bytes the cache holds.", gauge, func(s client.Stats) float64 { return f(s.BytesCached) })
	c.add("hoard_cache_limit_bytes", "The cache's size limit.", gauge, func(s client.Stats) float64 { return f(s.Limit) })
	c.add("hoard_cache_files", "Files with data in the cache.", gauge, func(s client.Stats) float64 { return f(s.Files) })
	c.add("hoard_cache_chunks", "Chunks in the cache.", gauge, func(s client.Stats) float64 { return f(s.Chunks) })
	c.add("hoard_cache_evictions_total", "Chunks evicted to make room.", counter, func(s client.Stats) float64 { return f(s.Evictions) })
	c.add("hoard_cache_bypassed_chunks_total", "Chunks read past the cache (bypassed, or no room).", counter, func(s client.Stats) float64 { return f(s.Bypassed) })
	c.add("hoard_cache_corrupt_chunks_total", "Chunks that failed their checksum and were fetched again.", counter, func(s client.Stats) float64 { return f(s.Corrupt) })
	c.add("hoard_client_rpcs_total", "Requests sent to servers.", counter, func(s client.Stats) float64 { return f(s.RPCs) })
	c.add("hoard_client_revalidations_total", "Status requests made because no promise was held.", counter, func(s client.Stats) float64 { return f(s.Revalidations) })
	c.add("hoard_client_stores_total", "Stores of file data sent to servers.", counter, func(s client.Stats) float64 { return f(s.Stores) })
	c.add("hoard_client_promises", "Callback promises held.", gauge, func(s client.Stats) float64 { return float64(s.Promises) })
	c.add("hoard_client_breaks_total", "Files whose promise a server broke.", counter, func(s client.Stats) float64 { return f(s.Breaks) })
	c.add("hoard_client_resets_total", "Times a server voided all promises (its restart).", counter, func(s client.Stats) float64 { return f(s.Resets) })
	c.add("hoard_client_read_delegations", "Read delegations held.", gauge, func(s client.Stats) float64 { return float64(s.ReadDelegations) })
	c.add("hoard_client_write_delegations", "Write delegations held.", gauge, func(s client.Stats) float64 { return float64(s.WriteDelegations) })
	c.add("hoard_client_local_opens_total", "Opens served under a delegation, without a request.", counter, func(s client.Stats) float64 { return f(s.LocalOpens) })
	c.add("hoard_client_recalls_total", "Delegations a server recalled.", counter, func(s client.Stats) float64 { return f(s.Recalls) })
	c.add("hoard_client_revoked_total", "Delegations a server revoked.", counter, func(s client.Stats) float64 { return f(s.Revoked) })
	c.add("hoard_client_dirty_bytes", "Bytes written and not yet stored (the write-back queue).", gauge, func(s client.Stats) float64 { return f(s.DirtyBytes) })
	c.add("hoard_client_flushed_bytes_total", "Bytes the write-back flusher stored.", counter, func(s client.Stats) float64 { return f(s.Flushed) })
	c.add("hoard_client_nodes", "Files and directories held in memory.", gauge, func(s client.Stats) float64 { return float64(s.Nodes) })
	c.add("hoard_client_dirty_age_seconds", "How long the oldest write not yet stored has waited.", gauge, func(s client.Stats) float64 { return s.DirtyAge.Seconds() })
	c.add("hoard_client_lost_writes_total", "Files whose writes could not be delivered and were kept in lost/ (hoard cache lost).", counter, func(s client.Stats) float64 { return f(s.Lost) })
	c.add("hoard_mount_passthrough_opens_total", "Opens of wholly cached files the kernel reads by FUSE passthrough, unseen by the daemon.", counter, func(s client.Stats) float64 { return f(s.Gauges["passthrough_opens"]) })
	c.addEmitter(prometheus.NewDesc("hoard_client_bypass_opens_total", "Opens that bypassed the cache, by the kind of rule that chose it.", []string{"rule"}, nil),
		func(s client.Stats, d *prometheus.Desc, ch chan<- prometheus.Metric) {
			for _, r := range policy.Rules {
				ch <- prometheus.MustNewConstMetric(d, counter, f(s.BypassOpens[r]), r)
			}
		})
	c.addLatency("hoard_client_fetch_duration_seconds", "How long fetches of a chunk from a server took.", func(s client.Stats) latency.Histogram { return s.FetchTime })
	c.addLatency("hoard_client_store_duration_seconds", "How long stores of file data to a server took.", func(s client.Stats) latency.Histogram { return s.StoreTime })
	reg.MustRegister(c)
}

// Proxy registers the metrics of a proxy's store: what it served its
// clients, against what it fetched from its origin (the proxy's client
// metrics count the origin's side too).
func Proxy(reg *prometheus.Registry, stats func() proxystore.Stats) {
	c := &snapshots[proxystore.Stats]{take: stats}
	f := func(v int64) float64 { return float64(v) }
	c.add("hoard_proxy_served_bytes_total", "Bytes served to the proxy's clients.", counter, func(s proxystore.Stats) float64 { return f(s.BytesServed) })
	c.add("hoard_proxy_origin_bytes_total", "Bytes fetched from the origin into the store.", counter, func(s proxystore.Stats) float64 { return f(s.BytesFetched) })
	c.add("hoard_proxy_hits_total", "Chunk reads served from the store.", counter, func(s proxystore.Stats) float64 { return f(s.Hits) })
	c.add("hoard_proxy_misses_total", "Chunk reads that fetched from the origin.", counter, func(s proxystore.Stats) float64 { return f(s.Misses) })
	c.add("hoard_proxy_store_bytes", "Bytes the store holds.", gauge, func(s proxystore.Stats) float64 { return f(s.BytesUsed) })
	c.add("hoard_proxy_store_limit_bytes", "The store's size.", gauge, func(s proxystore.Stats) float64 { return f(s.Limit) })
	c.add("hoard_proxy_evictions_total", "Chunks evicted from the store.", counter, func(s proxystore.Stats) float64 { return f(s.Evictions) })
	reg.MustRegister(c)
}

// Server registers the metrics of a server's load: load is its Load.
func Server(reg *prometheus.Registry, load func() server.Load) {
	c := &snapshots[server.Load]{take: load}
	c.add("hoard_server_sessions", "Client sessions connected.", gauge, func(l server.Load) float64 { return float64(l.Sessions) })
	c.add("hoard_server_promises", "Callback promises held by clients.", gauge, func(l server.Load) float64 { return float64(l.Promises) })
	c.add("hoard_server_delegations", "Delegations held by clients.", gauge, func(l server.Load) float64 { return float64(l.Delegations) })
	c.add("hoard_server_breaks_total", "Promises broken (files, per client).", counter, func(l server.Load) float64 { return float64(l.Broken) })
	c.add("hoard_server_recalls_total", "Delegations recalled.", counter, func(l server.Load) float64 { return float64(l.Recalled) })
	c.add("hoard_server_revokes_total", "Delegations revoked.", counter, func(l server.Load) float64 { return float64(l.Revoked) })
	c.add("hoard_server_resets_total", "Reset messages sent (all of a client's promises voided).", counter, func(l server.Load) float64 { return float64(l.Resets) })
	c.addLatency("hoard_server_callback_wait_seconds", "How long requests waited for other clients to acknowledge breaks and return recalled delegations.", func(l server.Load) latency.Histogram { return l.Waited })
	c.add("hoard_server_data_connections", "Bulk-data channel connections open.", gauge, func(l server.Load) float64 { return float64(l.DataConns) })
	c.add("hoard_server_data_connections_total", "Bulk-data channel connections accepted.", counter, func(l server.Load) float64 { return float64(l.DataAccepted) })
	c.add("hoard_server_data_sent_bytes_total", "File bytes sent on the bulk-data channel (fetches).", counter, func(l server.Load) float64 { return float64(l.DataSent) })
	c.add("hoard_server_data_received_bytes_total", "File bytes received on the bulk-data channel (stores).", counter, func(l server.Load) float64 { return float64(l.DataReceived) })
	reg.MustRegister(c)
}
