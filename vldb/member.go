package vldb

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MemberConfig describes an etcd member run inside a hoard process: the
// one a server embeds by default, or one of a cluster's (hoard etcd).
type MemberConfig struct {
	// Name is the member's name in its cluster ("default" if empty).
	Name string
	// Dir holds its data; its log goes to Dir/etcd.log.
	Dir string
	// ClientAddr and PeerAddr are host:port to listen on; port 0 picks
	// one. PeerAddr may be empty for a cluster of this member alone.
	ClientAddr, PeerAddr string
	// Cluster is etcd's initial cluster ("a=https://h:p,b=..."); empty:
	// this member alone. Ignored once Dir holds a member.
	Cluster string
	// CertFile, KeyFile and CAFile secure both listeners with the cell's
	// certificates, peers and clients alike proving themselves with one
	// the cell's CA signed; all empty: plain TCP.
	CertFile, KeyFile, CAFile string
}

// Member is a running etcd member.
type Member struct {
	e    *embed.Etcd
	once sync.Once
	// closing is set by Close, for the log (quietClose).
	closing *atomic.Bool
	// Endpoint is the URL its clients reach it at.
	Endpoint string
}

// StartMember starts an etcd member and waits until it serves (a member
// of a cluster: until the cluster has a leader), at most a minute.
func StartMember(c MemberConfig) (*Member, error) {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.PeerAddr == "" {
		c.PeerAddr = "127.0.0.1:0"
	}
	scheme := "http"
	if c.CertFile != "" {
		scheme = "https"
	}
	cu, err := url.Parse(scheme + "://" + c.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("etcd client address %q: %v", c.ClientAddr, err)
	}
	pu, err := url.Parse(scheme + "://" + c.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("etcd peer address %q: %v", c.PeerAddr, err)
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = c.Cluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + pu.String()
		// A member alone waits an election timeout before it leads;
		// with nobody to elect, a short one only starts it sooner.
		cfg.TickMs, cfg.ElectionMs = 10, 100
	}
	closing := new(atomic.Bool)
	zc := logutil.DefaultZapLoggerConfig
	zc.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	zc.OutputPaths = []string{filepath.Join(c.Dir, "etcd.log")}
	zc.ErrorOutputPaths = zc.OutputPaths
	lg, err := zc.Build(zap.WrapCore(func(core zapcore.Core) zapcore.Core { return quietClose{core, closing} }))
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: its log: %v", c.Name, err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// The database of a cell is small; keep its history an hour.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = embed.CompactorModePeriodic, "1h"
	if c.CertFile != "" {
		tls := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = tls, tls
	}
	// A location database is small: etcd's 64 MB write-ahead log
	// segments would take more room than it ever needs (a server's data
	// disk may be small), and a segment is preallocated, so a full disk
	// does not fail etcd's writes before the next segment.
	wal.SegmentSizeBytes = 1 << 20
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s in %s: %v", c.Name, c.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd member %s: %v", c.Name, err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("etcd member %s: no cluster leader within a minute (are the other members up?)", c.Name)
	}
	return &Member{e: e, closing: closing, Endpoint: scheme + "://" + e.Clients[0].Addr().String()}, nil
}

// Err reports an error that stopped the member.
func (m *Member) Err() <-chan error { return m.e.Err() }

// Close stops the member; again, nothing (embed's Close panics).
func (m *Member) Close() {
	m.once.Do(func() {
		m.closing.Store(true)
		m.e.Close()
	})
}

// quietClose is a member's log, less two errors, each with a stack
// trace, that an operator would take for faults: what etcd logs of its
// own listeners once Close has closed them, at every normal stop; and a
// new member's storage-version check that ran before it had a term.
type quietClose struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q quietClose) With(fs []zapcore.Field) zapcore.Core {
	return quietClose{q.Core.With(fs), q.closing}
}

func (q quietClose) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.Enabled(e.Level) {
		return ce.AddCore(e, q)
	}
	return ce
}

func (q quietClose) Write(e zapcore.Entry, fs []zapcore.Field) error {
	for _, f := range fs {
		if f.Type != zapcore.ErrorType {
			continue
		}
		err, _ := f.Interface.(error)
		switch {
		case err == nil:
		case q.closing.Load() && closedListener(err):
			return nil
		case e.Message == "failed to update storage version" && strings.HasSuffix(err.Error(), "missing term information"):
			// A new member's first check, before its first term is
			// kept; logged as a warning just before, and tried again.
			return nil
		}
	}
	return q.Core.Write(e, fs)
}

// closedListener reports err as a server's or a listener's end by Close
// (net's, net/http's, and in the words of the connection multiplexer
// etcd serves through, cmux: "mux: server closed", "mux: listener
// closed").
func closedListener(err error) bool {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "use of closed network connection") || strings.HasPrefix(msg, "mux: ") && strings.HasSuffix(msg, " closed")
}
