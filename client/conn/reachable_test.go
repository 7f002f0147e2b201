package conn

import "testing"

// A data channel advertised on every interface is reached at the host the
// control connection used; any other address is taken as advertised.
func TestReachable(t *testing.T) {
	for _, c := range []struct{ control, data, want string }{
		{"10.0.0.5:7100", "0.0.0.0:7101", "10.0.0.5:7101"},
		{"files.example:7100", "[::]:7101", "files.example:7101"},
		{"10.0.0.5:7100", "10.0.0.9:7101", "10.0.0.9:7101"},
		{"10.0.0.5:7100", "relay.example:9000", "relay.example:9000"},
		{"10.0.0.5:7100", "", ""},
	} {
		if got := reachable(c.control, c.data); got != c.want {
			t.Errorf("reachable(%q, %q) = %q, want %q", c.control, c.data, got, c.want)
		}
	}
}
