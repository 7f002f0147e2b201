package loginsock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
)

// tokens is a Handler that keeps each uid's token.
type tokens struct {
	mu  sync.Mutex
	uid map[uint32]string
}

func newTokens() *tokens { return &tokens{uid: map[uint32]string{}} }

func (t *tokens) Login(uid uint32, token string) (string, error) {
	if !strings.HasPrefix(token, "good-") {
		return "", errors.New("token not signed by this cell")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.uid[uid] = token
	return strings.TrimPrefix(token, "good-"), nil
}

func (t *tokens) Logout(uid uint32, cell string) error {
	if cell != "" && cell != "test" {
		return errors.New("this mount is of cell test")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.uid, uid)
	return nil
}

func (t *tokens) of(uid uint32) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.uid[uid]
}

// session runs the request lines in through Handle for uid and returns
// the replies.
func session(t *testing.T, h Handler, uid uint32, in string) ([]Reply, error) {
	t.Helper()
	var out bytes.Buffer
	err := Handle(struct {
		io.Reader
		io.Writer
	}{strings.NewReader(in), &out}, uid, "/mnt/hoard", h)
	var reps []Reply
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var r Reply
		if jerr := json.Unmarshal([]byte(line), &r); jerr != nil {
			t.Fatalf("reply %q: %v", line, jerr)
		}
		reps = append(reps, r)
	}
	return reps, err
}

func TestHandleLoginLogout(t *testing.T) {
	h := newTokens()
	reps, err := session(t, h, 1001, `{"op":"login","token":"good-alice"}`+"\n"+`{"op":"logout","cell":"other"}`+"\n")
	if !errors.Is(err, io.EOF) || len(reps) != 2 {
		t.Fatalf("%v, %v", reps, err)
	}
	if r := reps[0]; !r.OK || r.User != "alice" || r.Mount != "/mnt/hoard" || r.Error != "" {
		t.Errorf("login: %+v", r)
	}
	if r := reps[1]; r.OK || !strings.Contains(r.Error, "cell test") {
		t.Errorf("logout of another cell: %+v", r)
	}
	if got := h.of(1001); got != "good-alice" {
		t.Errorf("uid 1001's token: %q", got)
	}
	reps, _ = session(t, h, 1001, `{"op":"logout"}`) // no newline at the end
	if len(reps) != 1 || !reps[0].OK || h.of(1001) != "" {
		t.Errorf("logout: %+v; token left %q", reps, h.of(1001))
	}
}

// The kernel says who is connected: a request cannot name another uid,
// and sets only the token of the uid it came from.
func TestHandleOnlyTheCallersUID(t *testing.T) {
	h := newTokens()
	h.uid[1002] = "good-bob"
	reps, _ := session(t, h, 1001, `{"op":"login","token":"good-mallory","uid":1002}`+"\n"+`{"op":"logout","uid":1002}`+"\n")
	for _, r := range reps {
		if r.OK || r.Error == "" {
			t.Errorf("a request naming a uid: %+v", r)
		}
	}
	if h.of(1002) != "good-bob" || h.of(1001) != "" {
		t.Fatalf("tokens after: %v", h.uid)
	}
	session(t, h, 1001, `{"op":"login","token":"good-mallory"}`+"\n"+`{"op":"logout"}`+"\n")
	if h.of(1002) != "good-bob" {
		t.Fatalf("uid 1001 changed uid 1002's token: %v", h.uid)
	}
}

func TestHandleBadRequests(t *testing.T) {
	h := newTokens()
	for name, in := range map[string]string{
		"not json":       "login good-alice\n",
		"not an object":  `["login"]` + "\n",
		"unknown op":     `{"op":"setuid"}` + "\n",
		"no token":       `{"op":"login"}` + "\n",
		"refused token":  `{"op":"login","token":"forged"}` + "\n",
		"logout a token": `{"op":"logout","token":"good-alice"}` + "\n",
		"two objects":    `{"op":"login","token":"good-a"}{"op":"logout"}` + "\n",
	} {
		reps, err := session(t, h, 1001, in)
		if len(reps) != 1 || reps[0].OK || reps[0].Error == "" || reps[0].User != "" {
			t.Errorf("%s: %+v (%v)", name, reps, err)
		}
		if strings.Contains(reps[0].Error, "good-") {
			t.Errorf("%s: the reply repeats the token: %q", name, reps[0].Error)
		}
	}
	if len(h.uid) != 0 {
		t.Fatalf("a bad request set a token: %v", h.uid)
	}
}

func TestHandleOversizeLine(t *testing.T) {
	h := newTokens()
	in := `{"op":"login","token":"good-` + strings.Repeat("a", MaxLine) + `"}` + "\n" + `{"op":"login","token":"good-alice"}` + "\n"
	reps, err := session(t, h, 1001, in)
	if err == nil || len(reps) != 1 || !strings.Contains(reps[0].Error, "longer than") {
		t.Fatalf("an oversize line: %+v, %v", reps, err)
	}
	if len(h.uid) != 0 {
		t.Fatalf("tokens set after an oversize line: %v", h.uid)
	}
}

// Over a real socket, the mount learns the caller's uid from the kernel.
func TestSocket(t *testing.T) {
	h := newTokens()
	dir := filepath.Join(t.TempDir(), "mounts")
	s, err := Listen(dir, "/mnt/hoard", h, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Tell(s.Path(), Request{Op: "login", Token: "good-alice"})
	if err != nil || !rep.OK || rep.User != "alice" || rep.Mount != "/mnt/hoard" {
		t.Fatalf("login: %+v, %v", rep, err)
	}
	if got := h.of(uint32(os.Getuid())); got != "good-alice" {
		t.Fatalf("the token went to %v, want uid %d", h.uid, os.Getuid())
	}
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if want := os.FileMode(0o600); os.Geteuid() == 0 {
		if fi.Mode().Perm() != 0o666 {
			t.Errorf("root's socket is %v, want 0666", fi.Mode().Perm())
		}
	} else if fi.Mode().Perm() != want {
		t.Errorf("socket %v, want %v", fi.Mode().Perm(), want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
	if _, err := Tell(s.Path(), Request{Op: "logout"}); err == nil {
		t.Errorf("a closed socket answered")
	}
}

// One local user's connections are bounded apart from the others': a
// user holding the socket's connections once made another's login and
// logout skip the mount.
func TestSocketBoundedPerUser(t *testing.T) {
	s, err := Listen(filepath.Join(t.TempDir(), "mounts"), "/mnt/hoard", newTokens(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range maxPerUID {
		if !s.admit(1002) {
			t.Fatal("bob refused within his bound")
		}
	}
	if s.admit(1002) {
		t.Fatal("bob admitted past his bound")
	}
	if !s.admit(1001) {
		t.Fatal("alice refused while bob holds his connections")
	}
	s.release(1001)
	for range maxPerUID {
		s.release(1002)
	}
	// Through the socket: this user's idle connections past the bound
	// are closed at once, and an answer comes once one goes.
	var held []net.Conn
	for range maxPerUID {
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitAdmitted(t, s, maxPerUID)
	if _, err := Tell(s.Path(), Request{Op: "login", Token: "good-alice"}); err == nil {
		t.Fatal("a connection past this user's bound was served")
	}
	held[0].Close()
	waitAdmitted(t, s, maxPerUID-1)
	if rep, err := Tell(s.Path(), Request{Op: "login", Token: "good-alice"}); err != nil || !rep.OK {
		t.Fatalf("after one of the user's connections went: %+v, %v", rep, err)
	}
	for _, c := range held[1:] {
		c.Close()
	}
}

func waitAdmitted(t *testing.T, s *Server, n int) {
	t.Helper()
	poll.Wait(t, 5*time.Second, fmt.Sprintf("%d connections admitted", n), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.open == n
	})
}
