package main

import (
	"context"
	"fmt"
	"github.com/hoardfs/hoard/vnode"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/metrics"
	"github.com/hoardfs/hoard/mount"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/proxy"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/status"
)

// metricsFlag adds --metrics and --http to a long-running command.
func metricsFlag(f *pflag.FlagSet, addr, page *string) {
	f.StringVar(addr, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics (a bare port is on loopback; default: off)")
	f.StringVar(page, "http", "", "serve a live status page at http://ADDR/ (a bare port is on loopback; default: off); the same address as --metrics is one listener serving both")
}

// endpoint is a process's HTTP listeners (--metrics, --http), its
// metrics registry and its status page, opened before the process
// starts its work (a bad address changes nothing) and served once what
// they show exists. Every listener serves /metrics and the page (package
// status). A nil endpoint (neither flag) does nothing.
type endpoint struct {
	ls          []net.Listener
	metricsAt   string // where --metrics is served, "" if not asked
	pageAt      string // where --http is
	reg         *prometheus.Registry
	page        *status.Page
	invalidated status.Breaks
	// private: the page is its owner's alone (a mount's names the files
	// its users opened): metrics.OwnerOnly.
	private bool
}

// openMetrics opens --metrics and --http ("": not asked). An --http
// address that --metrics already opened is not opened again.
func openMetrics(metricsAddr, httpAddr string) (*endpoint, error) {
	if metricsAddr == "" && httpAddr == "" {
		return nil, nil
	}
	e := &endpoint{reg: metrics.Registry(), page: status.New()}
	if metricsAddr != "" {
		l, err := metrics.Listen("--metrics", metricsAddr)
		if err != nil {
			return nil, usageError{err}
		}
		e.ls, e.metricsAt = append(e.ls, l), l.Addr().String()
	}
	if httpAddr != "" {
		if len(e.ls) > 0 && sameAddr(e.ls[0], httpAddr) {
			e.pageAt = e.metricsAt
		} else {
			l, err := metrics.Listen("--http", httpAddr)
			if err != nil {
				e.close()
				return nil, usageError{err}
			}
			e.ls, e.pageAt = append(e.ls, l), l.Addr().String()
		}
	}
	return e, nil
}

// sameAddr reports whether addr (as --http takes it) names l's address.
func sameAddr(l net.Listener, addr string) bool {
	full, err := metrics.Address("--http", addr)
	if err != nil {
		return false
	}
	a, err := net.ResolveTCPAddr("tcp", full)
	la, ok := l.Addr().(*net.TCPAddr)
	return err == nil && ok && a.Port != 0 && a.Port == la.Port && a.IP.Equal(la.IP)
}

// show adds parts to the status page; name, if not "", is what the
// process serves, as the page titles it.
func (e *endpoint) show(name string, parts ...status.Part) {
	if e == nil {
		return
	}
	if name != "" {
		e.page.SetName(name)
	}
	e.page.Add(parts...)
}

// showServer shows srv, a server's or a proxy's, serving at addr.
func (e *endpoint) showServer(srv *server.Server, addr string) {
	if e != nil {
		e.show(addr, status.ServerPart(srv.Load, status.HandledRPCs(e.reg)))
	}
}

// showVolumes shows a server's volumes, as list lists them, and where
// its cell c (nil: none) has them.
func (e *endpoint) showVolumes(list func() ([]node.Volume, error), c *server.Cell) {
	if c == nil {
		e.show("", status.VolumesPart(list, nil, ""))
		return
	}
	e.show("", status.VolumesPart(list, c.DB, c.Name))
}

// showCell shows a server's standing in its cell c (nil: in none),
// store's disk, and the moves and releases srv has under way.
func (e *endpoint) showCell(c *server.Cell, store *vnode.Store, srv *server.Server) {
	if e == nil || c == nil {
		return
	}
	e.show("", status.CellPart(c.Name, c.DB.Holding, func() (uint64, uint64) { return diskSpace(store) }),
		status.MovesPart(srv.Underway))
}

// showProxy shows p's store and its traffic with its origin.
func (e *endpoint) showProxy(p *proxy.Proxy) {
	if e != nil {
		e.show("", status.ProxyPart(p.Origin(), p.Stats, p.OriginStats))
	}
}

// showMount shows c's cache and protocol state, mounted at dir by m.
func (e *endpoint) showMount(c *client.Client, m *mount.Mount, dir string) {
	if e != nil {
		e.private = true
		e.show(absDir(dir), status.MountPart(c.Stats, c.Nodes().LargestCached, pathsIn(m, dir), underDir(dir), &e.invalidated))
	}
}

// invalidations is the client's Options.OnInvalidate of mount m at dir:
// m's, listing on the page the files last invalidated.
func (e *endpoint) invalidations(m *mount.Mount, dir string) func([]node.FID) {
	if e == nil {
		return m.Invalidate
	}
	return e.invalidated.Wrap(m.Invalidate, pathsIn(m, dir))
}

// pathsIn names files by their paths in m, mounted at dir.
func pathsIn(m *mount.Mount, dir string) func(node.FID) (string, bool) {
	dir = absDir(dir)
	return func(f node.FID) (string, bool) {
		p, ok := m.PathOf(f)
		if !ok {
			return "", false
		}
		return filepath.Join(dir, p), true
	}
}

// underDir is where a mount at dir shows path p of the cell.
func underDir(dir string) func(p string) string {
	dir = absDir(dir)
	return func(p string) string { return filepath.Join(dir, p) }
}

func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// start serves the metrics registered so far and the page, keeps its
// history, and says where.
func (e *endpoint) start(name string) (stop func()) {
	if e == nil {
		return func() {}
	}
	e.page.SetKind(name)
	ctx, cancel := context.WithCancel(context.Background())
	go e.page.Record(ctx)
	var page http.Handler = e.page
	if e.private {
		page = metrics.OwnerOnly(page, uint32(os.Getuid()))
	}
	var stops []func()
	for _, l := range e.ls {
		stops = append(stops, metrics.Serve(l, e.reg, page))
	}
	var at []string
	if e.metricsAt != "" {
		at = append(at, fmt.Sprintf("metrics at http://%s/metrics", e.metricsAt))
	}
	pageAt := e.pageAt
	if pageAt == "" {
		pageAt = e.metricsAt
	}
	at = append(at, fmt.Sprintf("status page at http://%s/", pageAt))
	fmt.Fprintf(os.Stderr, "hoard %s: %s\n", name, strings.Join(at, ", "))
	return func() {
		cancel()
		for _, s := range stops {
			s()
		}
	}
}

// close gives the addresses back when the process ends before start.
func (e *endpoint) close() {
	if e == nil {
		return
	}
	for _, l := range e.ls {
		l.Close()
	}
}
