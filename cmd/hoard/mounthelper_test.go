package main

import "os"

// mount(8) runs the helper for an fstab entry such as
//
//	files.example:7100 /hoard fuse.hoard cache=/var/cache/hoard,token=/etc/hoard/token,ro,_netdev 0 0
//
// as below; -f (fake) and -v show what it would run.
func Example_mountHelper() {
	mountHelper([]string{"files.example:7100", "/hoard", "-f", "-v",
		"-o", "rw,cache=/var/cache/hoard,token=/etc/hoard/token,ro,_netdev,passthrough=false"}, os.Stdout)
	// Output:
	// hoard: running hoard mount --daemon --server=files.example:7100 --cache=/var/cache/hoard --token=/etc/hoard/token --passthrough=false -- /hoard
	// hoard: then setting ro on /hoard
}
