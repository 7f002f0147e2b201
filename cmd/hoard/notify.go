package main

import (
	"log/slog"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// notifyReady and notifyStopping tell systemd, when it started this
// process as a Type=notify service (NOTIFY_SOCKET), that the service is
// ready or stopping; they do nothing otherwise.
func notifyReady()    { notify(sd.SdNotifyReady) }
func notifyStopping() { notify(sd.SdNotifyStopping) }

func notify(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		slog.Warn("systemd not told of the service's state", "state", state, "err", err)
	}
}
