package vldb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hoardfs/hoard/principal"
)

// dbErr is a failed etcd request as one line.
func dbErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return errors.New("the location database (etcd) does not answer: are a majority of its members up?")
	}
	return fmt.Errorf("location database: %v", unwrap(err))
}

// NewID, as a Volume's ROID in Update, asks for the next free id.
const NewID = ^uint64(0)

func volumeKey(id uint64) string { return fmt.Sprintf("%s%016x", volumeKeys, id) }

// change refuses location changes while the lease is lost (ErrNoLease).
func (d *DB) change() error {
	if !d.holding.Load() {
		return ErrNoLease
	}
	return nil
}

// commit runs a transaction and waits for the copy to reflect it.
// ok is false when a comparison failed (someone else changed what it
// read).
func (d *DB) commit(ctx context.Context, cmp []clientv3.Cmp, ops ...clientv3.Op) (ok bool, err error) {
	resp, err := d.cli.Txn(ctx).If(cmp...).Then(ops...).Commit()
	if err != nil {
		return false, dbErr(err)
	}
	if !resp.Succeeded {
		return false, nil
	}
	return true, d.seen(ctx, resp.Header.Revision)
}

// Commit implements principal.Store: one etcd transaction.
func (d *DB) Commit(ctx context.Context, c principal.Change) (bool, error) {
	var cmps []clientv3.Cmp
	for _, e := range c.Expect {
		if e.Value == "" {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(e.Key), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.Value(e.Key), "=", e.Value))
		}
	}
	var ops []clientv3.Op
	for k, v := range c.Put {
		ops = append(ops, clientv3.OpPut(k, v))
	}
	for _, k := range c.Delete {
		ops = append(ops, clientv3.OpDelete(k))
	}
	return d.commit(ctx, cmps, ops...)
}

// Create adds v to the database. With v.ID 0 it is given the next free
// id; with an id (a volume a server already holds, registered at its
// start), that one, and later ids are given past it. ErrExists when the
// name or the id is taken.
func (d *DB) Create(ctx context.Context, v Volume) (Volume, error) {
	if err := d.change(); err != nil {
		return Volume{}, err
	}
	if v.Created.IsZero() {
		v.Created = time.Now()
	}
	for {
		resp, err := d.cli.Get(ctx, nextIDKey)
		if err != nil {
			return Volume{}, dbErr(err)
		}
		next, rev := uint64(1), int64(0)
		if len(resp.Kvs) > 0 {
			next, _ = strconv.ParseUint(string(resp.Kvs[0].Value), 10, 64)
			rev = resp.Kvs[0].ModRevision
		}
		w := v
		if w.ID == 0 {
			w.ID = next
		}
		next = max(next, w.ID+1)
		b, _ := json.Marshal(w)
		ok, err := d.commit(ctx,
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision(nextIDKey), "=", rev),
				clientv3.Compare(clientv3.CreateRevision(nameKeys+w.Name), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(volumeKey(w.ID)), "=", 0),
			},
			clientv3.OpPut(nextIDKey, strconv.FormatUint(next, 10)),
			clientv3.OpPut(nameKeys+w.Name, strconv.FormatUint(w.ID, 10)),
			clientv3.OpPut(volumeKey(w.ID), string(b)))
		if err != nil {
			return Volume{}, err
		}
		if ok {
			return w, nil
		}
		// Which comparison failed: a taken name or id is final, a
		// moved counter is a race to try again.
		names, err := d.cli.Get(ctx, nameKeys+w.Name)
		if err != nil {
			return Volume{}, dbErr(err)
		}
		if len(names.Kvs) > 0 {
			return Volume{}, fmt.Errorf("volume %s: %w", w.Name, ErrExists)
		}
		if v.ID != 0 {
			ids, err := d.cli.Get(ctx, volumeKey(v.ID))
			if err != nil {
				return Volume{}, dbErr(err)
			}
			if len(ids.Kvs) > 0 {
				return Volume{}, fmt.Errorf("volume id %d: %w", v.ID, ErrExists)
			}
		}
	}
}

// Update changes volume id as fn says, atomically: fn sees the volume as
// etcd has it and is called again if someone changed it meanwhile. An
// error from fn is returned and nothing is changed. fn setting ROID to
// NewID gives the volume's read-only copy the next free id.
func (d *DB) Update(ctx context.Context, id uint64, fn func(*Volume) error) (Volume, error) {
	if err := d.change(); err != nil {
		return Volume{}, err
	}
	for {
		resp, err := d.cli.Get(ctx, volumeKey(id))
		if err != nil {
			return Volume{}, dbErr(err)
		}
		if len(resp.Kvs) == 0 {
			return Volume{}, fmt.Errorf("volume id %d: %w", id, ErrNotFound)
		}
		var v Volume
		if err := json.Unmarshal(resp.Kvs[0].Value, &v); err != nil {
			return Volume{}, fmt.Errorf("volume id %d: bad record: %v", id, err)
		}
		name := v.Name
		if err := fn(&v); err != nil {
			return Volume{}, err
		}
		v.ID, v.Name = id, name
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(volumeKey(id)), "=", resp.Kvs[0].ModRevision)}
		var ops []clientv3.Op
		if v.ROID == NewID {
			// The read-only copy's id comes from the volumes' counter:
			// FIDs stay unique in the cell.
			next, err := d.cli.Get(ctx, nextIDKey)
			if err != nil {
				return Volume{}, dbErr(err)
			}
			rev := int64(0)
			v.ROID = 1
			if len(next.Kvs) > 0 {
				v.ROID, _ = strconv.ParseUint(string(next.Kvs[0].Value), 10, 64)
				rev = next.Kvs[0].ModRevision
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(nextIDKey), "=", rev))
			ops = append(ops, clientv3.OpPut(nextIDKey, strconv.FormatUint(v.ROID+1, 10)))
		}
		b, _ := json.Marshal(v)
		ok, err := d.commit(ctx, cmps, append(ops, clientv3.OpPut(volumeKey(id), string(b)))...)
		if err != nil || ok {
			return v, err
		}
	}
}

// Remove deletes volume id and its name.
func (d *DB) Remove(ctx context.Context, id uint64) error {
	if err := d.change(); err != nil {
		return err
	}
	v, ok := d.Volume(id)
	if !ok {
		return fmt.Errorf("volume id %d: %w", id, ErrNotFound)
	}
	ok, err := d.commit(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(nameKeys+v.Name), "=", strconv.FormatUint(id, 10))},
		clientv3.OpDelete(volumeKey(id)), clientv3.OpDelete(nameKeys+v.Name))
	if err == nil && !ok {
		err = fmt.Errorf("volume %s changed while being removed; try again", v.Name)
	}
	return err
}

// Register names this server in the cell and keeps it alive: a lease of
// ttl, renewed while the process lives, bounds the alive key. When the
// lease is lost (etcd unreachable past ttl), location changes are refused
// (ErrNoLease) and a new lease is sought until one is granted.
func (d *DB) Register(s Server, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	if s.Started.IsZero() {
		s.Started = time.Now()
	}
	lease, err := d.grant(ctx, s, ttl)
	if err != nil {
		return err
	}
	d.wg.Add(1)
	go d.keepAlive(s, ttl, lease)
	return nil
}

// grant takes a new lease and writes the server's record and alive key.
func (d *DB) grant(ctx context.Context, s Server, ttl time.Duration) (clientv3.LeaseID, error) {
	l, err := d.cli.Grant(ctx, int64(max(ttl/time.Second, 2)))
	if err != nil {
		return 0, dbErr(err)
	}
	b, _ := json.Marshal(s)
	if _, err := d.cli.Txn(ctx).Then(
		clientv3.OpPut(serverKeys+s.Name, string(b)),
		clientv3.OpPut(aliveKeys+s.Name, "", clientv3.WithLease(l.ID)),
	).Commit(); err != nil {
		return 0, dbErr(err)
	}
	d.holding.Store(true)
	d.lease.Store(int64(l.ID))
	return l.ID, nil
}

func (d *DB) keepAlive(s Server, ttl time.Duration, lease clientv3.LeaseID) {
	defer d.wg.Done()
	for {
		ctx, cancel := context.WithCancel(d.ctx)
		ka, err := d.cli.KeepAlive(ctx, lease)
		if err == nil {
			renewing(ka, ttl)
		}
		cancel()
		if d.ctx.Err() != nil {
			return
		}
		d.holding.Store(false)
		d.log.Warn("lease in the location database lost; location changes are refused until it is back", "server", s.Name)
		for d.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(d.ctx, ttl)
			lease, err = d.grant(ctx, s, ttl)
			cancel()
			if err == nil {
				d.log.Info("lease in the location database back", "server", s.Name)
				break
			}
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// renewing drains ka until it closes, or until no renewal came for ttl:
// etcd without a quorum renews no lease, yet may leave the channel open
// long past the lease's end, and the server would go on taking itself
// for alive.
func renewing(ka <-chan *clientv3.LeaseKeepAliveResponse, ttl time.Duration) {
	t := time.NewTimer(ttl)
	defer t.Stop()
	for {
		select {
		case _, ok := <-ka:
			if !ok {
				return
			}
			t.Reset(ttl)
		case <-t.C:
			return
		}
	}
}

// Holding says whether this server may change locations now.
func (d *DB) Holding() bool { return d.holding.Load() }

// SetSpace records a server's capacity and free bytes (placement reads
// them); written only when they changed by more than a few percent.
func (d *DB) SetSpace(ctx context.Context, name string, capacity, free uint64) error {
	s, ok := d.Server(name)
	if !ok {
		return fmt.Errorf("server %s is not registered", name)
	}
	if s.Capacity == capacity && diff(s.Free, free) < capacity/50 {
		return nil
	}
	s.Capacity, s.Free = capacity, free
	b, _ := json.Marshal(s)
	_, err := d.cli.Put(ctx, serverKeys+name, string(b))
	return err
}

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// Import writes servers and volumes in batches, as they are, over what
// the database holds: for loading a cell's database from elsewhere, and
// for the benchmark that fills one with a large cell. Servers imported
// are not alive (no lease).
func (d *DB) Import(ctx context.Context, servers []Server, vols []Volume) error {
	const batch = 64 // etcd takes at most 128 operations in a transaction
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := d.cli.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		if err != nil {
			return dbErr(err)
		}
		return nil
	}
	for _, s := range servers {
		b, _ := json.Marshal(s)
		ops = append(ops, clientv3.OpPut(serverKeys+s.Name, string(b)))
		if len(ops) >= batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	var next uint64
	for _, v := range vols {
		b, _ := json.Marshal(v)
		ops = append(ops, clientv3.OpPut(volumeKey(v.ID), string(b)), clientv3.OpPut(nameKeys+v.Name, strconv.FormatUint(v.ID, 10)))
		next = max(next, v.ID+1)
		if len(ops) >= batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(vols) > 0 {
		ops = append(ops, clientv3.OpPut(nextIDKey, strconv.FormatUint(next, 10)))
	}
	return flush()
}
