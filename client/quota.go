package client

import (
	"context"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// SetQuota bounds the bytes of volume's files (0: no bound); only an
// administrator may. Stores past it fail with EDQUOT.
func (c *Client) SetQuota(volume string, quota uint64) (Volume, error) {
	var v *pb.Volume
	err := c.atVolume(func(s *Client, _ string) error {
		return s.conn.Call(func(ctx context.Context) (err error) {
			v, err = s.rpc.SetVolume(ctx, &pb.SetVolumeRequest{Name: volume, Quota: quota})
			return err
		})
	})
	if err != nil {
		return Volume{}, cellErrOf("set quota of volume", volume, err)
	}
	return toVolume(v), nil
}
