package server

// Descriptors: every connection a server accepts costs one, and running
// out of them fails whatever asks next (an accept, a data file, the
// store's), so its bounds on connections must fit the process's limit
// (RLIMIT_NOFILE) with room to spare for the rest.

// Reserve is the descriptors kept for what is not a client's connection:
// the store, the data files requests have open, the location database's
// connections, logs, and the Go runtime's.
func Reserve(limit int) int { return 256 + limit/8 }

// FitDescriptors lowers the bounds on connections that would not fit
// limit descriptors: control connections (twice the sessions, one that
// never says Hello included) take at most half of what the reserve
// leaves, bulk-data connections a quarter (each may hold a data file
// open too), and one address at most an eighth of that, so that a flood
// from a few addresses leaves room for others. Bounds set lower stay as
// they are. It returns what it lowered.
func (c *Config) FitDescriptors(limit int) []Lowered {
	avail := max(limit-Reserve(limit), 16)
	var low []Lowered
	fit := func(v *int, most int, flag string) {
		most = max(most, 1)
		if *v == 0 || *v > most {
			low = append(low, Lowered{flag, *v, most})
			*v = most
		}
	}
	fit(&c.MaxSessions, avail/4, "max-sessions")
	fit(&c.MaxSessionsPerPeer, avail/32, "max-sessions-per-peer")
	fit(&c.MaxDataConns, avail/4, "max-data-conns")
	fit(&c.MaxDataConnsPerPeer, avail/32, "max-data-conns-per-peer")
	return low
}

// Lowered is a bound FitDescriptors lowered: the flag that sets it, what
// it was (0: none), what it is.
type Lowered struct {
	Flag     string
	From, To int
}
