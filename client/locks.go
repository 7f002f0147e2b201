package client

// Lock order
//
// Every lock of mount, client (with its packages site, conn, bypass, writeback
// and policy) and cache, outermost first. Take a lock only
// while holding none listed below it; "under it" says what it may take.
// Nothing enforces this: keep it current when a lock or a call changes.
//
//  0. The kernel's inode locks, held by a FUSE request while its handler
//     waits on the client and the server; the kernel needs them to apply
//     an invalidation. So no handler notifies the kernel: invalQueue.run
//     does, holding no lock, and Mount.Invalidate waits for it at most
//     InvalidateWait before the break is acked anyway.
//
// mount
//
//  1. hnode.mu: ptOpens, cachedOpens, ptVersion, ptFile, pageVersion,
//     sillyDir, sillyName, issued. Short. Under it only client calls that
//     end in leaf locks: Node.Complete, Pin, Unpin, Valid, CachePath (a site's table,
//     Entry.mu, Cache.mu, cache-file reads, stat). Never Node.Status or
//     anything else taking Node.mu, wmu or nsmu; never an RPC. One hnode.mu
//     at a time, never with Mount.mu. Handlers call the client holding none.
//  2. Mount.mu: inodes, older, gens, refs. Under it: invalQueue.mu
//     (kernelGen: hnode.late) and go-fuse's Inode locks (track: Forgotten).
//     Released before calling the client (untrack: Release, added: Hold)
//     and before kernel notifications (notify copies the inodes first).
//  3. invalQueue.mu and its cond: pending, added, done. Innermost in mount.
//     users.mu (the local users' tokens) and Mount.refusedMu (what the
//     last flush found refused) are leaves too: held only to read or
//     change their fields, taking nothing.
//
// client
//
//  4. File.mu: File.off. Held for a whole Read, Write or Seek, so across
//     RPCs, fetch waits and the locks below. One File.mu at a time.
//  5. bypass.Open.pub: orders launching write runs with publishing. Held
//     across the stage's store RPCs, the wait for a session to begin one
//     in, and waits for stores in flight (stores, slots).
//  6. bypass.Open.mu: the other Open fields, memChunk.refs and dropped.
//     Short; under it only stageIndex.mu (Unpublished). Not across an RPC
//     or a wait.
//  7. Node.wmu: orders a file's writers and truncations with its stores, so
//     a store never marks clean a byte written while it was in flight. Held
//     by design across write's and truncate's fresh and fetch, stores
//     (storeBack, storeLocked: Store RPC, settleFor, keepLost's disk I/O)
//     and giveBack's Return. Taken holding File.mu or nothing.
//  8. Node.nsmu (directories): orders files made, removed and settled here
//     with requests that change the directory at the server. Exclusive in
//     makeHere, removeHere, removeLater, renameHere, settle and giveBack,
//     held across CreateReserved; shared in hold, across the Create, Link,
//     Remove or Rename. Taken under the wmu of a file made in or removed
//     from the directory (removeLater, storeBack, storeLocked via
//     settleFor), never the reverse: storeBare, and giveBack's stores of
//     the files its settle created, run once nsmu is released.
//  9. site.Site.resMu: fids, fidsLife. Taken holding no client lock (makeHere
//     before nsmu; welcome on the back channel). Not across Reserve: reserved
//     drops it for the call, which one caller per volume makes
//     (site.Site.reserving), so a new session's Welcome never waits for it.
// 10. nodesMu: nodes, forgotten, writes of Node.forgot. Short. Under it
//     Node.mu, one node at a time (dropDelegations, madeDirs; invalidate
//     and resetPromises, which drop the users' rights with the promises).
// 11. Node.mu: st, rights and the fields of Node's groups (fileData,
//     writeBack, fileDeleg, dirListing, dirDeleg) not said to be under
//     another lock; madeFiles, madeState and madeBase change with nsmu
//     held as well. Under it only cache calls (cache.Entry, Entry
//     methods): it may wait for cache-file I/O (learn's SetStatus punches
//     holes), never for an RPC or another goroutine. No other client lock
//     is taken under it but a site's table lock, a leaf: learn installs a reply's promise
//     and its user's rights with its status, so that a break (cb.Break,
//     then invalidate, which drops the rights under Node.mu) comes wholly
//     before them, voiding them, or after.
// 12. Leaves, which take nothing: site.Site.mu (a site's callback table:
//     its promises, delegations and lease; Site.Table and the methods
//     over it; one site's at a time), site.Sites.mu (locations, sessions,
//     sites down), conn.Conn.mu (sessionC), writeback.Flusher.mu (dirty), bgMu
//     (closing), volMu (vols), roomMu (room), stageIndex.mu, policy.Ghosts.mu, the
//     singleflights' own (fileData.fetches runs fetchOne on its
//     goroutine). Short; never across an RPC or a wait.
//
// cache
//
// 13. Cache.flushMu: one Flush at a time, across the index commit and the
//     unlinks (disk I/O). Under it Cache.mu and Entry.mu, one after the other.
// 14. Entry.mu: the entry's fields and its chunks' n, crc and dirty. Held
//     across cache-file I/O, never network. Under it Cache.mu.
// 15. Cache.mu: entries, lru, used, pending, doomed, gauges, openFiles,
//     Entry.openElem, chunk.elem. Innermost. No I/O but unlinkDoomed's
//     unlink, which must see entries unchanged.
//
// One owner of a file's size
//
// A cached file's size and DataVersion belong to its cache.Entry, under
// Entry.mu, and nothing else writes them: local changes (Entry.WriteAt,
// Truncate) hold wmu as well, and whatever the server says of the file
// (fetch and store replies, GetStatus, lookups, breaks' refetches,
// settles) reaches the entry only through Entry.Learn, via learn and
// syncEntry, which merges it in one hold of Entry.mu: older versions are
// ignored, and the local size stands while writes or a truncation are
// unstored. Node.st keeps the server's other attributes; a reader of the
// size asks the entry (statusLocked). Never read the entry's status, change
// it and write it back: a truncation between the two would be undone.
// Entry.Cleaned, under wmu, takes a store's reply whole, as nothing local
// can have changed since the store read it.

// Two of a kind
//
//   - Node.mu: one at a time; a directory's is released before a child's.
//   - Node.wmu: another file's only by TryLock (the flusher's Drain for a
//     writer that holds its own; dropForgotten; storeBare, which leaves a
//     file it cannot lock to the flusher: the settle may have come from
//     that file's own store).
//   - Node.nsmu: only hold takes two, shared, in fidBefore order. A waiting
//     writer blocks new readers of a sync.RWMutex: never RLock one twice.
//   - A file's Node.wmu before its directory's Node.nsmu (replaceNamed).
//   - Entry.mu: another entry's only by TryLock (Cache.fileOpened). Cache.
//     reserve evicts under its victims' Entry.mu: call it holding none.
//   - bypass.Open.pub: publishFor takes other opens' pub, never the
//     caller's own.
//
// The back channel and the adapters
//
// conn.Conn's runSession answers a server that waits for it (acks,
// recalls); the client's handler runs on it. It takes only leaves,
// nodesMu, Node.mu and site.Site.resMu (Welcome), and makes no RPC: giveBack,
// reclaim, settle and renew go to spawn. A break drops promises
// under the site's table lock, clears Node.valid under nodesMu, then calls OnInvalidate on
// its own goroutine; the ack waits for that.
// OnInvalidate may also run holding a file's Node.wmu (storeBack or
// storeLocked, then settle, then uncovered) or a directory's Node.nsmu
// (giveBack). It must take only its own locks (Mount.Invalidate:
// invalQueue.mu, Mount.mu, go-fuse's), wait a bounded time, and never call
// into the client.
// OnRecall runs holding no client lock (giveBack's first step, or its own
// goroutine), because it may call back: a proxy's clients store through
// FIDs.StoreThrough, which takes Node.wmu. giveBack locks only after it.
//
// Lock-free, so that a cached read takes no client lock and no Cache.mu:
//   - Node.valid: the fast path's only check. Set under the site's table lock once
//     cb.Granted took the site.Ticket; cleared after cb dropped the promise.
//   - Node.madeIn, removedIn: written holding the directory's nsmu, read
//     without it (delegation, current, Valid); removeHere rechecks under it.
//   - Node.forgot: written under nodesMu; Hold reads it to skip the lock.
//   - Node.entry: set once under Node.mu, then read without it.
//   - fileData.fetching: fetches under way, for dropForgotten.
//   - Node.site (handOver changes it without locks: the caller may hold
//     the node's); conn.Conn.session, data, giveUp; site.Site.lease, renewing:
//     read by every RPC.
//   - File.closed, bp, seqNext, window; hnode.lateTicket (Mount.distrust);
//     Mount.withOlder (read on every write).
//   - Client.expiredLogged (a sync.Map): the tokens whose expiry was logged.
//   - Cache.lruGen, lruLen, chunk.gen (a hit moves no LRU under Cache.mu),
//     chunk.unchecked, Cache.dirtyBytes (flusher thresholds), counters.
