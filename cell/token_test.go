package cell

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// tokenCell is a cell with its issuer and a verifier whose clock is *now.
type tokenCell struct {
	dir string
	iss *Issuer
	v   *Verifier
	now *time.Time
}

func newTokenCell(t testing.TB, name string) *tokenCell {
	t.Helper()
	dir := newCell(t, name)
	iss, err := LoadIssuer(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tc := &tokenCell{dir: dir, iss: iss, now: &now}
	if tc.v, err = NewVerifier(ca, func() time.Time { return *tc.now }); err != nil {
		t.Fatal(err)
	}
	return tc
}

func isOne(err error, want ...error) bool {
	for _, w := range want {
		if errors.Is(err, w) {
			return true
		}
	}
	return false
}

func TestTokenRoundTrip(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	tok, issued, err := tc.iss.Issue(Claims{User: "alice@lab", UID: 1001}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if issued.Cell != "alpha" || len(issued.ID) != 32 || issued.Issued.IsZero() || issued.Expires.Sub(issued.Issued) != 24*time.Hour {
		t.Errorf("issued claims %+v", issued)
	}
	got, err := tc.v.Verify(tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !claimsEqual(got, issued) {
		t.Errorf("Verify: %+v, want %+v", got, issued)
	}
	if in, err := Inspect(tok); err != nil || !claimsEqual(in, issued) {
		t.Errorf("Inspect: %+v, %v", in, err)
	}
	// Each token its own ID.
	_, again, _ := tc.iss.Issue(Claims{User: "alice@lab", UID: 1001}, time.Hour)
	if again.ID == issued.ID {
		t.Error("two tokens with one ID")
	}
	if tc.v.Cell() != "alpha" {
		t.Errorf("Cell: %q", tc.v.Cell())
	}
}

func claimsEqual(a, b Claims) bool {
	return a.User == b.User && a.UID == b.UID && a.Admin == b.Admin && a.Cell == b.Cell && a.ID == b.ID &&
		a.Issued.Equal(b.Issued) && a.Expires.Equal(b.Expires)
}

func TestTokenExpired(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	tok, c, err := tc.iss.Issue(Claims{User: "bob", UID: 7}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	*tc.now = c.Expires.Add(-time.Second)
	if _, err := tc.v.Verify(tok); err != nil {
		t.Errorf("a second before expiry: %v", err)
	}
	*tc.now = c.Expires.Add(time.Second)
	if _, err := tc.v.Verify(tok); !errors.Is(err, ErrExpired) {
		t.Errorf("a second after expiry: %v, want ErrExpired", err)
	}
}

func TestTokenOtherCell(t *testing.T) {
	alpha, beta := newTokenCell(t, "alpha"), newTokenCell(t, "beta")
	tok, _, err := beta.iss.Issue(Claims{User: "mallory"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.v.Verify(tok); !errors.Is(err, ErrForged) {
		t.Errorf("another cell's token: %v, want ErrForged", err)
	}
	// Another cell that calls itself alpha: still not alpha's key.
	fake := newTokenCell(t, "alpha")
	tok, _, _ = fake.iss.Issue(Claims{User: "mallory"}, time.Hour)
	if _, err := alpha.v.Verify(tok); !errors.Is(err, ErrForged) {
		t.Errorf("a same-named cell's token: %v, want ErrForged", err)
	}
	// alpha's key, but saying it is beta's: refused by the issuer check.
	tok = signed(t, alpha.iss, "EdDSA", claimsMap(func(m map[string]any) { m["iss"] = "beta" }))
	if _, err := alpha.v.Verify(tok); !errors.Is(err, ErrForged) {
		t.Errorf("a token of alpha's key naming beta: %v, want ErrForged", err)
	}
}

func segments(t *testing.T, tok string) []string {
	t.Helper()
	p := strings.Split(tok, ".")
	if len(p) != 3 {
		t.Fatalf("token %q: %d segments", tok, len(p))
	}
	return p
}

func b64(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(data)
}

func TestTokenTampered(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	tok, _, err := tc.iss.Issue(Claims{User: "alice", UID: 1001}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := segments(t, tok)
	// Every byte of the payload flipped in turn.
	for i := range len(p[1]) {
		b := []byte(p[1])
		b[i] ^= 0x01
		bad := p[0] + "." + string(b) + "." + p[2]
		if _, err := tc.v.Verify(bad); !isOne(err, ErrForged, ErrMalformed) {
			t.Fatalf("payload byte %d flipped: %v", i, err)
		}
	}
	// A well-formed payload that makes alice root, with the old signature.
	var m map[string]any
	data, _ := base64.RawURLEncoding.DecodeString(p[1])
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["uid"], m["adm"] = 0, true
	if _, err := tc.v.Verify(p[0] + "." + b64(m) + "." + p[2]); !errors.Is(err, ErrForged) {
		t.Errorf("payload rewritten: %v, want ErrForged", err)
	}
	// The signature's last character spelled otherwise (its unused low
	// bits): the same bytes, but not the token issued.
	s := []byte(p[2])
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", s[len(s)-1])
	s[len(s)-1] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last^1]
	if _, err := tc.v.Verify(p[0] + "." + p[1] + "." + string(s)); !isOne(err, ErrForged, ErrMalformed) {
		t.Errorf("signature respelled: %v", err)
	}
	if _, err := tc.v.Verify(p[0] + "." + p[1] + "."); !isOne(err, ErrForged, ErrMalformed) {
		t.Errorf("signature removed: %v", err)
	}
}

// claimsMap is a valid payload of cell alpha, changed by edit.
func claimsMap(edit func(map[string]any)) map[string]any {
	now := time.Now()
	m := map[string]any{
		"sub": "alice", "iss": "alpha", "jti": strings.Repeat("ab", 16),
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "uid": 1001, "adm": false,
	}
	edit(m)
	return m
}

// signed makes a token by hand: header {"alg": alg}, payload m, signed
// with the issuer's key for EdDSA, with the CA's public key as an HMAC
// secret for HS256 (the old confusion attack), not at all for none.
func signed(t *testing.T, iss *Issuer, alg string, m map[string]any) string {
	t.Helper()
	text := b64(map[string]string{"alg": alg, "typ": "JWT"}) + "." + b64(m)
	var sig []byte
	switch alg {
	case "EdDSA":
		var err error
		if sig, err = jwt.SigningMethodEdDSA.Sign(text, iss.key); err != nil {
			t.Fatal(err)
		}
	case "HS256":
		h := hmac.New(sha256.New, []byte(iss.key.Public().(ed25519.PublicKey)))
		h.Write([]byte(text))
		sig = h.Sum(nil)
	}
	return text + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestTokenOtherAlgorithms(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	good := claimsMap(func(map[string]any) {})
	if _, err := tc.v.Verify(signed(t, tc.iss, "EdDSA", good)); err != nil {
		t.Fatalf("a hand-made EdDSA token: %v", err)
	}
	for _, alg := range []string{"none", "None", "HS256", "RS256", "ES256", ""} {
		if _, err := tc.v.Verify(signed(t, tc.iss, alg, good)); !isOne(err, ErrForged, ErrMalformed) {
			t.Errorf("alg %q: %v, want ErrForged or ErrMalformed", alg, err)
		}
	}
	// none by jwt's own hand.
	tok, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims(good)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.v.Verify(tok); !errors.Is(err, ErrForged) {
		t.Errorf("alg none: %v, want ErrForged", err)
	}
}

func TestTokenBadClaims(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	for what, edit := range map[string]func(map[string]any){
		"no uid":          func(m map[string]any) { delete(m, "uid") },
		"uid a string":    func(m map[string]any) { m["uid"] = "0" },
		"uid negative":    func(m map[string]any) { m["uid"] = -1 },
		"uid too big":     func(m map[string]any) { m["uid"] = 1 << 32 },
		"uid fraction":    func(m map[string]any) { m["uid"] = 1.5 },
		"no adm":          func(m map[string]any) { delete(m, "adm") },
		"adm a string":    func(m map[string]any) { m["adm"] = "true" },
		"no exp":          func(m map[string]any) { delete(m, "exp") },
		"exp a string":    func(m map[string]any) { m["exp"] = "soon" },
		"no iat":          func(m map[string]any) { delete(m, "iat") },
		"no jti":          func(m map[string]any) { delete(m, "jti") },
		"short jti":       func(m map[string]any) { m["jti"] = "abcd" },
		"no sub":          func(m map[string]any) { delete(m, "sub") },
		"sub bad":         func(m map[string]any) { m["sub"] = "alice smith" },
		"sub system":      func(m map[string]any) { m["sub"] = "system:server" },
		"sub too long":    func(m map[string]any) { m["sub"] = strings.Repeat("a", 65) },
		"sub a number":    func(m map[string]any) { m["sub"] = 5 },
		"not yet valid":   func(m map[string]any) { m["nbf"] = time.Now().Add(time.Hour).Unix() },
		"payload a list":  func(m map[string]any) { clear(m) },
		"payload is null": nil,
	} {
		var tok string
		switch what {
		case "payload a list":
			text := b64(map[string]string{"alg": "EdDSA"}) + "." + base64.RawURLEncoding.EncodeToString([]byte("[1,2]"))
			sig, _ := jwt.SigningMethodEdDSA.Sign(text, tc.iss.key)
			tok = text + "." + base64.RawURLEncoding.EncodeToString(sig)
		case "payload is null":
			text := b64(map[string]string{"alg": "EdDSA"}) + "." + base64.RawURLEncoding.EncodeToString([]byte("null"))
			sig, _ := jwt.SigningMethodEdDSA.Sign(text, tc.iss.key)
			tok = text + "." + base64.RawURLEncoding.EncodeToString(sig)
		default:
			tok = signed(t, tc.iss, "EdDSA", claimsMap(edit))
		}
		if _, err := tc.v.Verify(tok); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", what, err)
		}
	}
}

func TestTokenGarbage(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	tok, _, _ := tc.iss.Issue(Claims{User: "alice"}, time.Hour)
	long := tok + strings.Repeat("A", MaxToken)
	if _, err := tc.v.Verify(long); !errors.Is(err, ErrMalformed) {
		t.Errorf("over-long: %v, want ErrMalformed", err)
	}
	if _, err := Inspect(long); !errors.Is(err, ErrMalformed) {
		t.Errorf("Inspect over-long: %v, want ErrMalformed", err)
	}
	for _, g := range []string{"", ".", "..", "...", "a.b.c", "a.b", "\x00\xff", "Bearer " + tok, tok + ".", " " + tok,
		"eyJhbGciOiJFZERTQSJ9.e30.", "eyJhbGciOiJFZERTQSJ9.bnVsbA.AAAA", strings.Repeat(".", MaxToken)} {
		if _, err := tc.v.Verify(g); !isOne(err, ErrMalformed, ErrForged) {
			t.Errorf("Verify(%.40q): %v, want ErrMalformed or ErrForged", g, err)
		}
		if _, err := Inspect(g); err == nil {
			t.Errorf("Inspect(%.40q) succeeded", g)
		}
	}
}

func TestIssueRefuses(t *testing.T) {
	tc := newTokenCell(t, "alpha")
	for _, u := range []string{"", "system:x", "a b", "a/b", strings.Repeat("u", 65), "ünï"} {
		if _, _, err := tc.iss.Issue(Claims{User: u}, time.Hour); err == nil {
			t.Errorf("Issue for user %q succeeded", u)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, _, err := tc.iss.Issue(Claims{User: "alice"}, ttl); err == nil {
			t.Errorf("Issue lasting %v succeeded", ttl)
		}
	}
}

func TestLoadIssuerNoKey(t *testing.T) {
	cellDir := newCell(t, "alpha")
	out := filepath.Join(t.TempDir(), "s")
	if err := IssueCert(cellDir, out, RoleServer, "s", nil); err != nil {
		t.Fatal(err)
	}
	_, err := LoadIssuer(out)
	if want := out + " holds no cell CA key (ca.key): tokens are issued where the cell was made"; err == nil || err.Error() != want {
		t.Errorf("LoadIssuer: %v, want %s", err, want)
	}
	// A CA key that is not the CA certificate's.
	other := newCell(t, "beta")
	data, _ := os.ReadFile(filepath.Join(other, CAKeyFile))
	os.WriteFile(filepath.Join(cellDir, CAKeyFile), data, 0o600)
	if _, err := LoadIssuer(cellDir); err == nil || !strings.Contains(err.Error(), "is not the key of") {
		t.Errorf("LoadIssuer with another cell's key: %v", err)
	}
}

func TestNewVerifierRefuses(t *testing.T) {
	dir := newCell(t, "alpha")
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewVerifier(id.Cert.Leaf, nil); err == nil {
		t.Error("NewVerifier with a server certificate succeeded")
	}
	if _, err := NewVerifier(nil, nil); err == nil {
		t.Error("NewVerifier(nil) succeeded")
	}
}

func FuzzVerify(f *testing.F) {
	tc := newTokenCell(f, "alpha")
	// The only strings Verify may accept: the ones the cell issued.
	valid := map[string]bool{}
	for _, c := range []Claims{{User: "alice", UID: 1001}, {User: "root@x", Admin: true}} {
		tok, _, err := tc.iss.Issue(c, time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		valid[tok] = true
		f.Add(tok)
		p := strings.Split(tok, ".")
		f.Add(b64(map[string]string{"alg": "none"}) + "." + p[1] + ".")
		f.Add(b64(map[string]string{"alg": "HS256"}) + "." + p[1] + "." + p[2])
	}
	other := newTokenCell(f, "beta")
	tok, _, _ := other.iss.Issue(Claims{User: "mallory"}, time.Hour)
	f.Add(tok)
	f.Add("")
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJFZERTQSJ9.e30.")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := tc.v.Verify(s)
		if err != nil {
			if !isOne(err, ErrMalformed, ErrForged, ErrExpired) {
				t.Fatalf("Verify(%q): %v wraps none of ErrMalformed, ErrForged, ErrExpired", s, err)
			}
		} else if !valid[s] {
			t.Fatalf("Verify accepted %q (%+v), a token the cell never issued", s, c)
		}
		Inspect(s)
	})
}
