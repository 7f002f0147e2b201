package server

import (
	"context"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/node"
)

// change is a request that changes files or the namespace, as its handler
// states it: op.make runs the frame they all share.
type change struct {
	// check, if set, refuses the change before anything is held or
	// recalled: the caller may not make it.
	check func(o *op) error
	// hold are the FIDs no delegation is granted on until the change is
	// made (busy); recall are more FIDs whose delegations other clients,
	// as hold's, give back before it is made.
	hold, recall []node.FID
	// store makes the change, once those are back, and returns what it
	// changed, or the error to reply with. It may hold more (op.hold):
	// the files of names a first recall let it look up.
	store func(o *op) (changed []node.FID, err error)
}

// change begins a change of the caller's and makes c (op.make).
func (s *Server) change(ctx context.Context, c change) (*op, error) {
	o, err := s.beginChange(ctx, callback.Changing)
	if err != nil {
		return nil, err
	}
	if c.check != nil {
		if err := c.check(o); err != nil {
			return nil, err
		}
	}
	return o, o.make(ctx, c)
}

// make makes change c of o's client: other clients' delegations first,
// then the store, then other clients' promises on what it changed, broken
// before make returns, so before the reply.
func (o *op) make(ctx context.Context, c change) error {
	defer o.release()
	leave, err := o.s.enter(volumesOf(append(c.hold[:len(c.hold):len(c.hold)], c.recall...)...)...)
	if err != nil {
		return err
	}
	defer leave()
	if err := o.hold(ctx, c.hold, c.recall...); err != nil {
		return err
	}
	changed, err := c.store(o)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		o.changed(ctx, changed...)
	}
	return nil
}

// hold marks fids busy until o's change is made, and recalls other
// clients' delegations on them and on also.
func (o *op) hold(ctx context.Context, fids []node.FID, also ...node.FID) error {
	if len(fids)+len(also) == 0 {
		return nil
	}
	s := o.s
	s.mu.Lock()
	s.cb.BeginChange(fids)
	s.mu.Unlock()
	o.held = append(o.held, fids...)
	_, err := s.recallFor(ctx, o, true, append(fids[:len(fids):len(fids)], also...)...)
	return err
}

// release ends what hold began.
func (o *op) release() {
	if len(o.held) == 0 {
		return
	}
	o.s.mu.Lock()
	o.s.cb.EndChange(o.held)
	o.s.mu.Unlock()
	o.held = nil
}
