package client

import (
	"github.com/hoardfs/hoard/client/user"
	"time"
)

// volRoom is what a close under write-back may take of a volume: the free
// space of its quota the server said at asked, less the growth of the
// files accepted since.
type volRoom struct {
	free  int64
	asked time.Time
}

// roomFresh is how long a volume's free space, as asked, stands for the
// closes that follow: other clients' stores change it meanwhile.
const roomFresh = 2 * time.Second

// roomFor reports whether a close may keep n's writes in the cache, as
// u: the volume, if it has a quota, has room for the growth they bring.
// Otherwise the close stores them, and the server's refusal (EDQUOT)
// reaches the application at close, as AFS's store on close does, rather
// than be found by the flusher after the close said all was well.
// Another client filling the volume within roomFresh can still make a
// later store fail: the write-back window.
func (c *Client) roomFor(n *Node, u user.User) bool {
	est, ok := n.entry.Status()
	n.mu.Lock()
	server := n.st.Size
	n.mu.Unlock()
	if !ok || est.Size <= server {
		return true // no growth: the server takes it
	}
	grow := int64(est.Size - server)
	vol := n.fid.Volume
	if !c.quotaKnown(vol) {
		return true // no quota: the write-back window covers a full disk
	}
	c.roomMu.Lock()
	r := c.room[vol]
	if r != nil && time.Since(r.asked) < roomFresh && r.free >= grow {
		r.free -= grow
		c.roomMu.Unlock()
		return true
	}
	c.roomMu.Unlock()
	fs, err := n.at().StatFS(vol, u.Token())
	if err != nil {
		return true // the server is away: the write-back holds the writes
	}
	free := int64(fs.BlocksFree * uint64(fs.BlockSize))
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	if c.room == nil {
		c.room = map[uint64]*volRoom{}
	}
	r = &volRoom{free: free, asked: time.Now()}
	c.room[vol] = r
	if r.free < grow {
		return false
	}
	r.free -= grow
	return true
}

// quotaKnown reports whether volume has a quota, as far as this client
// knows: its record says so (GetVolume, at the mount of the volume), or
// a store in it was refused for quota since (quotaRefused). Only such
// volumes cost a close a StatFS, at most every roomFresh.
func (c *Client) quotaKnown(volume uint64) bool {
	c.roomMu.Lock()
	_, known := c.room[volume]
	c.roomMu.Unlock()
	if known {
		return true
	}
	c.volMu.Lock()
	defer c.volMu.Unlock()
	for _, v := range c.vols {
		if v.Id == volume && v.Quota > 0 {
			return true
		}
	}
	return false
}

// quotaRefused notes that a store in volume was refused for its quota:
// its closes check for room from now on.
func (c *Client) quotaRefused(volume uint64) {
	c.roomMu.Lock()
	defer c.roomMu.Unlock()
	if c.room == nil {
		c.room = map[uint64]*volRoom{}
	}
	if c.room[volume] == nil {
		c.room[volume] = &volRoom{}
	}
}
