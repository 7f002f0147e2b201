// Package datapath moves file contents between a cache manager and a file
// server. Fetch and store sit behind one interface so that the bulk-data
// channel can change (gRPC streams on the control connection today, split
// zero-copy connections later) without the cache manager noticing.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Sink receives fetched data: one call per piece, in offset order, each
// with the data version it was read at. The slice is the sink's to keep,
// and to give back with PutBuffer when it is done with it.
type Sink func(off int64, dv uint64, data []byte) error

// Range is a byte range of a file.
type Range struct{ Off, Len int64 }

// StoreArgs describes one store: the ranges to send and the size changes.
type StoreArgs struct {
	FID         node.FID
	BaseVersion uint64
	Ranges      []Range
	// Read fills p with the file's bytes at off (from the cache file).
	Read        func(p []byte, off int64) error
	HasTruncate bool
	Truncate    uint64
	HasSize     bool
	Size        uint64
	Sync        bool
	Mtime       time.Time
	// DelegState is the delegation the writes were made under (0: none):
	// the server refuses the store if the client no longer holds it.
	DelegState uint64
	// Op names the store, the same in every attempt: the server makes it
	// once (node.Op).
	Op string
	// Stage names a run of stores the server keeps aside until the one
	// with Publish makes them all visible at once (StoreRequest.stage).
	Stage   string
	Publish bool
}

// bytes is how many bytes the store sends.
func (a StoreArgs) bytes() int64 {
	var n int64
	for _, r := range a.Ranges {
		n += r.Len
	}
	return n
}

// eachPiece reads the store's bytes from the local data a piece at a time
// into one buffer and hands each piece to send. A failure to read the
// local data is a *localError.
func (a StoreArgs) eachPiece(send func(off int64, p []byte) error) error {
	buf := GetBuffer(int(min(maxPiece, max(a.bytes(), 1))))
	defer PutBuffer(buf)
	for _, r := range a.Ranges {
		for off := r.Off; off < r.Off+r.Len; {
			p := buf[:min(int64(len(buf)), r.Off+r.Len-off)]
			if err := a.Read(p, off); err != nil {
				return &localError{fmt.Errorf("store %v: reading local data at %d: %w", a.FID, off, err)}
			}
			if err := send(off, p); err != nil {
				return err
			}
			off += int64(len(p))
		}
	}
	return nil
}

// localError is a store's failure on the client's side, not the path's.
type localError struct{ err error }

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// Path moves data. Both calls return the file's status after the
// operation and any callback promise granted with it.
type Path interface {
	Fetch(ctx context.Context, fid node.FID, off, n int64, piece int, sink Sink) (node.Status, time.Duration, error)
	Store(ctx context.Context, a StoreArgs) (node.Status, time.Duration, error)
}

// GRPC carries data over the control connection's gRPC streams.
type GRPC struct {
	Client pb.FileServerClient
}

// Fetch implements Path.
func (g GRPC) Fetch(ctx context.Context, fid node.FID, off, n int64, piece int, sink Sink) (node.Status, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.Client.Fetch(ctx, &pb.FetchRequest{Fid: pb.FromFID(fid), Offset: uint64(off), Length: uint64(n), Piece: uint32(piece)})
	if err != nil {
		return node.Status{}, 0, err
	}
	first, err := stream.Recv()
	if err != nil {
		return node.Status{}, 0, err
	}
	st, ttl, err := first.Status.ToStatus()
	if err != nil {
		return st, 0, err
	}
	for m := first; ; {
		if len(m.Data) > 0 {
			if err := sink(int64(m.Offset), m.DataVersion, m.Data); err != nil {
				return st, ttl, err
			}
		}
		m, err = stream.Recv()
		if err == io.EOF {
			return st, ttl, nil
		}
		if err != nil {
			return st, ttl, err
		}
	}
}

// maxPiece is the most data one store message carries.
const maxPiece = 1 << 20

// Store implements Path.
func (g GRPC) Store(ctx context.Context, a StoreArgs) (node.Status, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.Client.Store(ctx)
	if err != nil {
		return node.Status{}, 0, err
	}
	if err := stream.Send(storeHeader(a)); err != nil {
		return node.Status{}, 0, sendErr(stream, err)
	}
	err = a.eachPiece(func(off int64, p []byte) error {
		// Send marshals before it returns, so p is free again after.
		if err := stream.Send(&pb.StoreRequest{Offset: uint64(off), Data: p}); err != nil {
			return sendErr(stream, err)
		}
		return nil
	})
	if err != nil {
		return node.Status{}, 0, err
	}
	reply, err := stream.CloseAndRecv()
	if err != nil {
		return node.Status{}, 0, err
	}
	return reply.Status.ToStatus()
}

// storeHeader is the store's description without its data.
func storeHeader(a StoreArgs) *pb.StoreRequest {
	hdr := &pb.StoreRequest{Fid: pb.FromFID(a.FID), BaseVersion: a.BaseVersion,
		HasTruncate: a.HasTruncate, Truncate: a.Truncate, HasSize: a.HasSize, Size: a.Size, Sync: a.Sync, DelegState: a.DelegState, Op: a.Op,
		Stage: a.Stage, Publish: a.Publish}
	if !a.Mtime.IsZero() {
		hdr.MtimeNs = a.Mtime.UnixNano()
	}
	return hdr
}

// sendErr digs out the server's error: a Send that fails with EOF means the
// server ended the stream, and the reason comes with the close.
func sendErr(stream pb.FileServer_StoreClient, err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}
