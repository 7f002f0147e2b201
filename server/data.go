package server

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server/datachan"
)

// ServeData starts the bulk-data channel (package datachan) on l, which
// runs until l is closed, and advertises it to clients that connect from
// now on. Clients are told to connect to advertise, or to l's address if
// it is empty.
func (s *Server) ServeData(l net.Listener, advertise string) {
	if advertise == "" {
		advertise = l.Addr().String()
	}
	s.dataAddr.Store(&advertise)
	files, _ := s.local.(datachan.Files)
	datachan.Serve(l, dataHandler{s}, datachan.Config{
		MaxConns: s.cfg.MaxDataConns, MaxConnsPerPeer: s.cfg.MaxDataConnsPerPeer,
		RequestTimeout: s.cfg.DataRequestTimeout, IdleTimeout: s.cfg.DataIdleTimeout,
		TLS: s.cfg.TLS, Files: files, Counts: &s.data, Log: s.log})
}

// dataHandler is the server as the data channel asks it.
type dataHandler struct{ *Server }

func (s dataHandler) Session(token string, from net.Addr) (callback.ClientID, error) {
	return s.live(token, from, false)
}

func (s dataHandler) BeginFetch(id callback.ClientID, user string, state *tls.ConnectionState, f node.FID) (datachan.Fetch, error) {
	o := s.opFor(id)
	var err error
	if o.who, err = s.whoIs(user, state); err == nil {
		err = o.may(f, access.Read, "read")
	}
	if err == nil {
		_, err = s.recallFor(context.Background(), o, false, f)
	}
	if err != nil {
		return nil, err
	}
	return fetching{o, f}, nil
}

func (s dataHandler) BeginStore(ctx context.Context, id callback.ClientID, user string, state *tls.ConnectionState, hdr *pb.StoreRequest) (datachan.Store, error) {
	if err := s.storeGrace(ctx, hdr); err != nil {
		return nil, err
	}
	o := s.opFor(id)
	var err error
	if o.who, err = s.whoIs(user, state); err != nil {
		return nil, err
	}
	x, err := s.beginStore(o, hdr)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return x, nil
}

func (s dataHandler) Elsewhere(err error) bool { return elsewhere(s.wire(err)) }

// fetching is a data-channel fetch begun.
type fetching struct {
	o *op
	f node.FID
}

func (x fetching) Status(st node.Status) *pb.Status { return x.o.status(st) }

func (x fetching) ReadAt(p []byte, off int64) (int, node.Status, error) {
	return x.o.s.store.ReadAt(x.f, p, off, x.o.user)
}
