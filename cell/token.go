package cell

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Claims is what a token says. Registered claims: sub = User, iss = Cell,
// jti = ID, iat = Issued, exp = Expires; private: "uid" (number), "adm" (bool).
type Claims struct {
	User    string
	UID     uint32
	Admin   bool
	Cell    string
	ID      string // random, 128 bits, hex: names the token for revocation
	Issued  time.Time
	Expires time.Time
}

// MaxToken bounds a token's length: a longer one is refused unparsed.
const MaxToken = 4096

// The errors Verify wraps.
var (
	ErrMalformed = errors.New("malformed token")
	ErrForged    = errors.New("token not signed by this cell")
	ErrExpired   = errors.New("token expired")
)

// userRE is a user's name. It leaves out ':', so no user is named like the
// cell's own "system:" principals; checkUser refuses those by name as well,
// should the set ever grow.
var userRE = regexp.MustCompile(`^[a-zA-Z0-9._@-]{1,64}$`)

// idRE is a token's ID as Issue makes it: 128 bits in lower-case hex.
var idRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

func checkUser(u string) error {
	if !userRE.MatchString(u) || strings.HasPrefix(u, "system:") {
		return fmt.Errorf("user name %q: want 1 to 64 of a-z, A-Z, 0-9, '.', '_', '@', '-'", u)
	}
	return nil
}

// jwtClaims is a token's payload as JSON. uid and adm are pointers so
// that a token without them is told from one saying 0 or false.
type jwtClaims struct {
	jwt.RegisteredClaims
	UID   *uint32 `json:"uid"`
	Admin *bool   `json:"adm"`
}

// claims checks a payload has every claim Issue writes, well-formed, and
// turns it into Claims.
func (j *jwtClaims) claims() (Claims, error) {
	switch {
	case j.UID == nil:
		return Claims{}, fmt.Errorf("%w: no uid", ErrMalformed)
	case j.Admin == nil:
		return Claims{}, fmt.Errorf("%w: no adm", ErrMalformed)
	case j.IssuedAt == nil:
		return Claims{}, fmt.Errorf("%w: no iat", ErrMalformed)
	case j.ExpiresAt == nil:
		return Claims{}, fmt.Errorf("%w: no exp", ErrMalformed)
	case !idRE.MatchString(j.ID):
		return Claims{}, fmt.Errorf("%w: jti %.40q: want 32 hex digits", ErrMalformed, j.ID)
	case checkName("cell", j.Issuer) != nil:
		return Claims{}, fmt.Errorf("%w: iss %.70q: not a cell name", ErrMalformed, j.Issuer)
	}
	if err := checkUser(j.Subject); err != nil {
		return Claims{}, fmt.Errorf("%w: sub: %.90v", ErrMalformed, err)
	}
	return Claims{
		User:    j.Subject,
		UID:     *j.UID,
		Admin:   *j.Admin,
		Cell:    j.Issuer,
		ID:      j.ID,
		Issued:  j.IssuedAt.Time,
		Expires: j.ExpiresAt.Time,
	}, nil
}

// Issuer signs tokens with a cell's CA key. It is safe for concurrent use.
type Issuer struct {
	key  ed25519.PrivateKey
	cell string
	now  func() time.Time
}

// LoadIssuer reads the CA key and certificate of the cell in dir (one-line
// error if dir has no ca.key: "DIR holds no cell CA key (ca.key): tokens
// are issued where the cell was made").
func LoadIssuer(dir string) (*Issuer, error) {
	key, ca, err := loadCA(dir, "tokens")
	if err != nil {
		return nil, err
	}
	name, _ := cellName(ca) // checked by loadCA
	return &Issuer{key: key, cell: name, now: time.Now}, nil
}

// Issue signs a token for c.User (required, 1..64 chars of [a-zA-Z0-9._@-],
// not beginning with "system:"), lasting ttl (>0); it fills Cell, ID,
// Issued (now) and Expires, and returns the token and the claims as issued.
func (i *Issuer) Issue(c Claims, ttl time.Duration) (string, Claims, error) {
	if err := checkUser(c.User); err != nil {
		return "", Claims{}, err
	}
	if ttl <= 0 {
		return "", Claims{}, fmt.Errorf("token lifetime %v: want a positive one", ttl)
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return "", Claims{}, err
	}
	now := i.now()
	c.Cell = i.cell
	c.ID = hex.EncodeToString(id)
	// A token holds whole seconds: the claims returned are the ones in it.
	c.Issued = now.Truncate(time.Second)
	c.Expires = now.Add(ttl).Truncate(time.Second)
	if !c.Expires.After(c.Issued) {
		c.Expires = c.Issued.Add(time.Second)
	}
	uid, adm := c.UID, c.Admin
	j := jwtClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   c.User,
			Issuer:    c.Cell,
			ID:        c.ID,
			IssuedAt:  jwt.NewNumericDate(c.Issued),
			ExpiresAt: jwt.NewNumericDate(c.Expires),
		},
		UID:   &uid,
		Admin: &adm,
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, &j).SignedString(i.key)
	if err != nil {
		return "", Claims{}, fmt.Errorf("signing a token: %v", err)
	}
	return s, c, nil
}

// Verifier checks tokens against a cell's CA. It is safe for concurrent use.
type Verifier struct {
	pub    ed25519.PublicKey
	cell   string
	parser *jwt.Parser
}

// NewVerifier checks tokens of the cell whose CA is ca. now nil: time.Now.
func NewVerifier(ca *x509.Certificate, now func() time.Time) (*Verifier, error) {
	if ca == nil {
		return nil, errors.New("no CA certificate to verify tokens with")
	}
	name, err := cellName(ca)
	if err != nil {
		return nil, err
	}
	pub, ok := ca.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("cell %s: its CA key is a %T, not Ed25519", name, ca.PublicKey)
	}
	if now == nil {
		now = time.Now
	}
	return &Verifier{pub: pub, cell: name, parser: jwt.NewParser(
		jwt.WithValidMethods([]string{"EdDSA"}),
		jwt.WithIssuer(name),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(now),
		// One spelling per token: no padding, no stray low bits.
		jwt.WithStrictDecoding(),
	)}, nil
}

// Cell is the name of the cell whose tokens v checks.
func (v *Verifier) Cell() string { return v.cell }

// Verify returns what a token says, or an error wrapping ErrMalformed (too
// long, not a JWT, missing/ill-typed claims, bad user name), ErrForged (bad
// signature, another key, alg not EdDSA including "none", another cell),
// or ErrExpired. It never panics on any input.
func (v *Verifier) Verify(token string) (Claims, error) {
	if len(token) > MaxToken {
		return Claims{}, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxToken)
	}
	var j jwtClaims
	_, err := v.parser.ParseWithClaims(token, &j, func(*jwt.Token) (any, error) { return v.pub, nil })
	if err != nil {
		return Claims{}, classify(err, &j)
	}
	return j.claims()
}

// classify maps jwt's errors onto ours; their text stays, for logs.
func classify(err error, j *jwtClaims) error {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable),
		errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return fmt.Errorf("%w: %v", ErrForged, err)
	case errors.Is(err, jwt.ErrTokenExpired) && j.ExpiresAt != nil:
		return fmt.Errorf("%w at %s", ErrExpired, j.ExpiresAt.Format(time.RFC3339))
	case errors.Is(err, jwt.ErrTokenExpired):
		return fmt.Errorf("%w: %v", ErrExpired, err)
	default:
		// A missing exp, an nbf in the future: nothing Issue writes.
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
}

// Inspect parses a token without checking its signature, for display
// (hoard tokens). It checks the claims are all there and well-formed.
func Inspect(token string) (Claims, error) {
	if len(token) > MaxToken {
		return Claims{}, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxToken)
	}
	var j jwtClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &j); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return j.claims()
}
