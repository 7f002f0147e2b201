package client

import (
	"errors"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
)

// cellOf is the Client as its sites' Cell (site.Sites): it begins
// sessions and moves nodes between them.
type cellOf struct{ c *Client }

func (cl cellOf) Dial(key, addr string, patience time.Duration) (*site.Site, error) {
	opts := cl.c.opts
	if patience == 0 {
		patience = opts.Patience
	}
	return cl.c.start(addr, cl.c.sessionFile("session."+key), patience)
}

func (cl cellOf) HandOver(vol uint64, to *site.Site) bool { return cl.c.handOver(vol, to) }

func (cl cellOf) Forget(name string) {
	cl.c.volMu.Lock()
	delete(cl.c.vols, name)
	cl.c.volMu.Unlock()
}

// maxHops bounds how often one request follows its node: a site's
// connection may not yet know the site died (the request is sent there
// again, and fails over when it waits out its patience), and the volume
// may move once more meanwhile.
const maxHops = 3

// onServer runs f at the site of the server holding n, and again
// wherever relocated (with stale) says n went, up to maxHops times.
func (n *Node) onServer(stale bool, f func(at *site.Site) error) error {
	for hop := 0; ; hop++ {
		at := n.at()
		err := f(at)
		if hop == maxHops || !n.c.relocated(n, at, err, stale) {
			return err
		}
	}
}

// relocated reports whether err, from site at about node n, came of n's
// volume moving away from at's server, and n now belongs to another
// site: its refusal said so (and moved followed it), or, where stale is
// set (requests about n itself, which its server should know), the
// server no longer has it, which the first server is asked about.
func (c *Client) relocated(n *Node, at *site.Site, err error, stale bool) bool {
	s := c.sites
	if err == nil {
		return false
	}
	if n.at() != at || s.Failover(n.fid.Volume, at, err) {
		return true
	}
	if stale && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESTALE) || pb.Errno(err) == syscall.ENOENT || pb.Errno(err) == syscall.ESTALE) {
		// The data channel says no more than that: the first server's
		// copy of the location database is asked.
		switch l, err := s.Ask(&pb.LocateRequest{Id: n.fid.Volume}, c.self.Token()); {
		case err != nil:
		case l.Here:
			s.MovedTo(l.Id, s.First())
		default:
			s.Moved(l)
		}
	}
	return n.at() != at
}

// handOver gives the nodes of volume vol to site to, and reports whether
// any belonged to another site. Their promises there are dropped: the
// server they came from broke them, or cannot be reached.
func (c *Client) handOver(vol uint64, to *site.Site) bool {
	var ns []*Node
	c.nodesMu.Lock()
	for fid, n := range c.nodes {
		if fid.Volume == vol && n.at() != to {
			ns = append(ns, n)
		}
	}
	c.nodesMu.Unlock()
	c.sites.Each(func(s *site.Site) {
		if s != to {
			s.DropReserved(vol)
		}
	})
	if len(ns) == 0 {
		return false
	}
	from := map[*site.Site]bool{}
	for _, n := range ns {
		at := n.at()
		at.Break(n.fid)
		n.valid.Store(false)
		n.site.Store(to)
		from[at] = true
	}
	for at := range from {
		c.log.Info("a volume's files follow it to another server", "volume", vol, "files", len(ns), "from", at.Addr, "to", to.Addr)
	}
	return true
}
