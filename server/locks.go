package server

// Lock order
//
// The server's locks, and the locks of the packages it calls that call
// back into it, outermost first. Take a lock only while holding none
// listed below it. Nothing enforces this: keep it current when a lock or
// a call changes (client/locks.go is the client's).
//
//  1. vldb.DB.mu: the location database's copy. Its watch applies each
//     change under it, and calls its mirrors' Apply there: the principal
//     registry's, which takes principal.Registry.mu (a leaf) and then,
//     outside it, the OnChange hooks. A server's hook takes users.mu only;
//     telling clients of a change of rights (tellRightsChanged, which
//     takes Server.mu) runs on a goroutine of its own. Nothing holding
//     Server.mu or moves.mu calls the location database.
//  2. Server.mu: sessions, their connections and counts, reservations'
//     counts, and the callback machine (cb, pure: no locks, no I/O).
//     Under it only non-blocking sends on connections' queues. The store
//     (vnode) is never called under it: vnode's file locks are its own,
//     taken by requests holding none of the server's.
//  3. moves.mu and its cond: the holds on volumes (volhold.State, pure:
//     frozen, quiet, departing, receiving, and the changes under way on
//     each) and the passes under way. Never held with Server.mu: a move
//     takes one, lets it go, then the other.
//  4. stage.Table's mu, then a stage.Stage's mu (never the other way):
//     the stages kept across requests, and one stage's writes.
//  5. users.mu: the identities of verified tokens. A leaf.
