package server

import "testing"

// The bounds on connections fit the descriptor limit with the reserve to
// spare, whatever they were set to; bounds that fit already stay.
func TestFitDescriptors(t *testing.T) {
	for _, limit := range []int{64, 1024, 20000, 1 << 20} {
		c := DefaultConfig()
		c.FitDescriptors(limit)
		conns := 2*c.MaxSessions + c.MaxDataConns
		if conns+Reserve(limit) > limit && limit > 64 {
			t.Errorf("limit %d: %d connections and a reserve of %d do not fit", limit, conns, Reserve(limit))
		}
		if c.MaxSessions <= 0 || c.MaxSessionsPerPeer <= 0 || c.MaxDataConns <= 0 || c.MaxDataConnsPerPeer <= 0 {
			t.Errorf("limit %d: a bound is off or zero: %+v", limit, c)
		}
		// A flood from six addresses leaves room for a seventh.
		if limit >= 1024 && (6*c.MaxSessionsPerPeer >= c.MaxSessions || 6*c.MaxDataConnsPerPeer >= c.MaxDataConns) {
			t.Errorf("limit %d: six addresses fill a bound: %+v", limit, c)
		}
	}
	c := DefaultConfig()
	if low := c.FitDescriptors(1 << 20); len(low) != 0 || c.MaxSessions != DefaultConfig().MaxSessions {
		t.Errorf("defaults lowered under a limit of 2^20: %v", low)
	}
	c.MaxSessions = 0 // "no bound" is a bound of the limit's
	if low := c.FitDescriptors(1024); len(low) == 0 || c.MaxSessions == 0 {
		t.Errorf("no bound stayed no bound under 1024 descriptors: %v", low)
	}
}
