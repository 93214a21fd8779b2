"""A U-Net-shaped chain profile and its skip edges, as several graph tests use them."""

from __future__ import annotations

from planner.graph import SkipEdge

CHAIN = """\
# format: pplan-profile/1
# model: tests.unet_model:build
# input_bytes_per_sample: 3072
layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes
0,enc1,1,1.0,2.0,100,10,0
1,down1,1,1.0,2.0,0,10,1024
2,enc2,1,1.0,2.0,100,10,0
3,down2,1,1.0,2.0,0,10,512
4,mid,1,1.0,2.0,100,10,1024
5,up2,1,1.0,2.0,100,10,4096
6,dec2,1,1.0,2.0,100,10,2048
7,up1,1,1.0,2.0,100,10,8192
8,dec1,1,1.0,2.0,100,10,4096
9,head,1,1.0,2.0,100,10,2048
"""
UNET_EDGES = (SkipEdge(0, 7, 4096, (1,)), SkipEdge(2, 5, 2048, (3,)))
