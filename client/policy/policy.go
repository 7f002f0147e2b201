// Package policy decides whether a file's contents go through the chunk
// cache or bypass it, straight from the network to the reader (after
// Improving AFS Performance via Selective Caching). It is pure: the
// client gathers the facts, this package applies the rules.
//
// Decided per file when it is opened, first rule that speaks wins:
//
//  1. an override set on the file, or else on the directory it is opened
//     in (`hoard cache policy`), kept in the cache index across eviction
//     and restarts;
//  2. the name: "++name" is cached, "__name" bypassed;
//  3. the volume: one named "__something" bypasses;
//  4. the size threshold (Options.BypassThreshold), when set;
//  5. auto: behaviour. A large file that fits in the cache's free space is
//     cached; otherwise one read once, sequentially, end to end is not
//     admitted until it is opened again within the ghost window, and a
//     random read admits it at once.
package policy

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Values of an override.
const (
	Cache  = "cache"
	Bypass = "bypass"
	Auto   = "auto"
)

// Rules are the kinds of rule a Decision names, in the order they are
// tried.
var Rules = [...]string{"override", "name", "volume", "threshold", "auto"}

// Decision is the policy in force for a file and why.
type Decision struct {
	Bypass bool
	// Probation: auto chose bypass for a large file seen for the first
	// time; a random read turns it into a cached file.
	Probation bool
	Why       string
	// Rule is the kind of rule that spoke: override, name, volume,
	// threshold or auto (metrics count bypasses by it).
	Rule string
}

func (d Decision) String() string {
	mode := Cache
	if d.Bypass {
		mode = Bypass
	}
	return mode + " (" + d.Why + ")"
}

// Facts are what the rules look at. The last two are asked only when
// the rules reach them: asking UsedAgain counts the open as a use.
type Facts struct {
	// FileOverride and DirOverride are the overrides set on the file and
	// on the directory it is opened in ("" or Auto: none).
	FileOverride, DirOverride string
	// Name is the file's name in that directory; Volume its volume's.
	Name, Volume string
	Size         int64
	// Threshold is the size threshold (0: none, auto decides); AutoMin
	// the size below which auto always caches.
	Threshold, AutoMin int64
	// Free is the cache's free space.
	Free int64
	// UsedAgain reports whether the file was used within the ghost
	// window; PartlyCached whether some of it is in the cache already.
	UsedAgain, PartlyCached func() bool
}

// Decide applies the rules to f.
func Decide(f Facts) Decision {
	if m := f.FileOverride; m != "" && m != Auto {
		return Decision{Bypass: m == Bypass, Why: "override on the file", Rule: "override"}
	}
	if m := f.DirOverride; m != "" && m != Auto {
		return Decision{Bypass: m == Bypass, Why: "override on its directory", Rule: "override"}
	}
	switch {
	case strings.HasPrefix(f.Name, "++"):
		return Decision{Why: "name starts with ++", Rule: "name"}
	case strings.HasPrefix(f.Name, "__"):
		return Decision{Bypass: true, Why: "name starts with __", Rule: "name"}
	}
	if strings.HasPrefix(f.Volume, "__") {
		return Decision{Bypass: true, Why: fmt.Sprintf("volume %s", f.Volume), Rule: "volume"}
	}
	if t := f.Threshold; t > 0 {
		if f.Size >= t {
			return Decision{Bypass: true, Why: fmt.Sprintf("size %d ≥ threshold %d", f.Size, t), Rule: "threshold"}
		}
		return Decision{Why: fmt.Sprintf("size %d < threshold %d", f.Size, t), Rule: "threshold"}
	}
	if f.Size < f.AutoMin {
		return Decision{Why: "auto: small file", Rule: "auto"}
	}
	if f.Free >= f.Size {
		// Admission control is for what admitting would evict: with
		// room to spare, the first read caches the file, and the next
		// one need not fetch it again.
		return Decision{Why: "auto: fits without evicting", Rule: "auto"}
	}
	if f.UsedAgain() {
		return Decision{Why: "auto: used again within the window", Rule: "auto"}
	}
	if f.PartlyCached() {
		return Decision{Why: "auto: partly cached already", Rule: "auto"}
	}
	return Decision{Bypass: true, Probation: true, Why: "auto: large file, first use", Rule: "auto"}
}

// ForDirectory is the policy a directory's files inherit from its
// override.
func ForDirectory(override string) Decision {
	if override == "" || override == Auto {
		return Decision{Why: "no override on the directory: its files decide by name, volume, size and use"}
	}
	return Decision{Bypass: override == Bypass, Why: "override on the directory, inherited by its files"}
}

// Ghosts remembers large files read once, so that a second use within the
// window admits them (a bounded list: the oldest are forgotten first).
type Ghosts struct {
	mu     sync.Mutex
	seen   map[node.FID]time.Time
	order  []node.FID
	max    int
	window time.Duration
}

// NewGhosts remembers up to max files for window.
func NewGhosts(max int, window time.Duration) *Ghosts {
	return &Ghosts{seen: map[node.FID]time.Time{}, max: max, window: window}
}

// Use reports whether f was used within the window before now, and with
// record counts this as a use.
func (g *Ghosts) Use(f node.FID, now time.Time, record bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.seen[f]
	recent := ok && now.Sub(t) <= g.window
	if !record {
		return recent
	}
	if !ok {
		g.order = append(g.order, f)
		for len(g.order) > g.max {
			delete(g.seen, g.order[0])
			g.order = g.order[1:]
		}
	}
	g.seen[f] = now
	return recent
}
