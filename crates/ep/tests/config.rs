//! Up-front configuration validation: each rule rejects with an error naming the field
//! and the limit.

use mori_ep::*;

fn base() -> EpConfig {
    EpConfig::new(8, 7168, 256, 8, 4096).unwrap()
}

fn field_of(e: EpError) -> &'static str {
    match e {
        EpError::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn defaults_follow_geometry() {
    let c = base();
    assert_eq!((c.experts_per_rank, c.num_experts(), c.max_recv_tokens), (32, 256, 8 * 4096));
    assert_eq!((c.kernel_type, c.gpus_per_node, c.block_num, c.warps_per_block), (KernelType::IntraNode, 8, 128, 16));
    let c16 = EpConfig::new(16, 7168, 256, 8, 128).unwrap();
    assert_eq!((c16.kernel_type, c16.rdma_block_num, c16.block_num), (KernelType::InterNodeV1, 64, 96));
    assert_eq!(c16.topology().unwrap().num_nodes(), 2);
    // Slot bytes: 7168 x 4 + 8 x 4 + 8 x 4 + 0 + 4 (seed 003 with max_token_type_size 4).
    assert_eq!(c.token_slot_bytes().unwrap(), 28672 + 68);
    assert_eq!(c.recv_buffer_bytes().unwrap(), (28672 + 68) * 8 * 4096);
}

#[test]
fn top_k_limit() {
    let mut c = base();
    c.top_k = MAX_TOP_K + 1;
    assert_eq!(c.validate(), Err(EpError::TopKTooLarge { top_k: 33, limit: 32 }));
    c.top_k = 0;
    assert_eq!(field_of(c.validate().unwrap_err()), "top_k");
    c.top_k = MAX_TOP_K;
    assert!(c.validate().is_ok());
}

#[test]
fn hidden_bytes_multiple_of_16() {
    let mut c = base();
    c.hidden = 7172; // x 4 B = 28688 = 16 x 1793: fine
    assert!(c.validate().is_ok());
    c.hidden = 7170; // x 4 B = 28680: not a multiple of 16
    let e = c.validate().unwrap_err();
    assert!(matches!(e, EpError::HiddenBytesNotAligned { hidden: 7170, elem_size: 4, bytes: 28680, .. }), "{e}");
    assert!(e.to_string().contains("multiple of 16"));
}

#[test]
fn experts_divisible_by_world() {
    assert_eq!(EpConfig::new(6, 1024, 256, 8, 16), Err(EpError::ExpertsNotDivisible { num_experts: 256, world: 6 }));
    assert!(matches!(dispatch_layout(&Tensor2::<i64>::default(), 10, 4, 4), Err(EpError::ExpertsNotDivisible { .. })));
}

#[test]
fn receive_buffer_must_hold_the_worst_case() {
    let mut c = base();
    c.max_recv_tokens = 8 * 4096 - 1;
    let e = c.validate().unwrap_err();
    assert_eq!(e, EpError::RecvBufferTooSmall { max_recv_tokens: 8 * 4096 - 1, required: 8 * 4096 });
    c.max_tokens_per_rank = usize::MAX / 4;
    assert!(matches!(c.validate(), Err(EpError::SizeOverflow { .. })));
    // Flat source index rank x max_tokens + token must fit i32.
    let mut c = base();
    c.max_tokens_per_rank = (i32::MAX as usize) / 8 + 1;
    c.max_recv_tokens = usize::MAX;
    assert!(matches!(c.validate(), Err(EpError::SizeOverflow { limit: "i32::MAX", .. })));
}

#[test]
fn launch_and_topology_fields() {
    let mut c = base();
    c.rank = 8;
    assert_eq!(field_of(c.validate().unwrap_err()), "rank");
    let mut c = base();
    c.warps_per_block = 33;
    assert_eq!(field_of(c.validate().unwrap_err()), "warps_per_block");
    let mut c = base();
    c.block_num = 0;
    assert_eq!(field_of(c.validate().unwrap_err()), "block_num");
    let mut c = base();
    c.gpus_per_node = 3; // 8 ranks do not split into nodes of 3
    assert_eq!(field_of(c.validate().unwrap_err()), "world_size");
    let mut c = base();
    c.gpus_per_node = 4; // two nodes but IntraNode
    assert_eq!(field_of(c.validate().unwrap_err()), "kernel_type");
    c.kernel_type = KernelType::InterNodeV1;
    c.block_num = 64;
    c.rdma_block_num = 64; // needs at least one XGMI block
    assert_eq!(field_of(c.validate().unwrap_err()), "rdma_block_num");
    c.rdma_block_num = 32;
    assert!(c.validate().is_ok());
    c.kernel_type = KernelType::AsyncLL;
    assert!(c.validate().is_ok());
    let mut c = base();
    c.max_token_type_size = 3;
    assert_eq!(field_of(c.validate().unwrap_err()), "max_token_type_size");
    let mut c = base();
    c.scale_dim = 56;
    c.scale_type_size = 3;
    assert_eq!(field_of(c.validate().unwrap_err()), "scale_type_size");
    assert_eq!(field_of(EpConfig::new(0, 1024, 8, 1, 1).unwrap_err()), "world_size");
}

#[test]
fn kernel_type_follows_the_configured_node_size() {
    // 16 ranks on one node of 16: IntraNode, and a small launch is accepted.
    let mut c = EpConfig::with_gpus_per_node(16, 16, 7168, 256, 8, 128).unwrap();
    assert_eq!((c.kernel_type, c.gpus_per_node, c.block_num, c.rdma_block_num, c.warps_per_block), (KernelType::IntraNode, 16, 128, 0, 16));
    assert_eq!(c.topology().unwrap().num_nodes(), 1);
    c.set_block_num(8);
    assert_eq!((c.block_num, c.rdma_block_num), (8, 0));
    assert!(c.validate().is_ok());
    // 16 ranks, 8 per node: InterNodeV1 with its RDMA blocks.
    let c = EpConfig::with_gpus_per_node(16, 8, 7168, 256, 8, 128).unwrap();
    assert_eq!((c.kernel_type, c.block_num, c.rdma_block_num, c.warps_per_block), (KernelType::InterNodeV1, 96, 64, 8));
    assert_eq!(c.topology().unwrap().num_nodes(), 2);
    // `new` keeps nodes of min(8, world).
    assert_eq!(EpConfig::new(16, 7168, 256, 8, 128).unwrap(), c);
    // Re-deriving after construction: the bench's former order (new, then gpus_per_node).
    let mut c = EpConfig::new(16, 7168, 256, 8, 128).unwrap();
    c.set_gpus_per_node(16);
    c.set_block_num(8);
    assert_eq!((c.kernel_type, c.rdma_block_num), (KernelType::IntraNode, 0));
    assert!(c.validate().is_ok());
    c.set_gpus_per_node(4);
    assert_eq!((c.kernel_type, c.block_num, c.rdma_block_num), (KernelType::InterNodeV1, 96, 64));
    assert!(c.validate().is_ok());
    // Assigning the field alone keeps the old kernel type (documented): one node of 16
    // under InterNodeV1's launch, whose RDMA blocks exceed a small block_num.
    let mut c = EpConfig::new(16, 7168, 256, 8, 128).unwrap();
    c.gpus_per_node = 16;
    c.block_num = 8;
    assert_eq!(field_of(c.validate().unwrap_err()), "rdma_block_num");
    // A node size that does not divide the world is refused at construction.
    assert_eq!(field_of(EpConfig::with_gpus_per_node(16, 6, 7168, 256, 8, 128).unwrap_err()), "world_size");
}

#[test]
fn rdma_blocks_follow_block_num() {
    let mut c = EpConfig::with_gpus_per_node(16, 8, 1024, 64, 4, 16).unwrap();
    for (b, r) in [(96, 64), (8, 5), (3, 2), (2, 1)] {
        c.set_block_num(b);
        assert_eq!(c.rdma_block_num, r, "block_num {b}");
        assert!(c.validate().is_ok(), "block_num {b}");
    }
    c.set_block_num(1); // no room for an XGMI block
    assert_eq!(field_of(c.validate().unwrap_err()), "rdma_block_num");
    c.set_kernel_type(KernelType::AsyncLL);
    assert_eq!((c.block_num, c.rdma_block_num, c.warps_per_block), (96, 0, 8));
    c.set_block_num(1);
    assert!(c.validate().is_ok());
    c.set_kernel_type(KernelType::InterNodeV1LL);
    assert_eq!((c.block_num, c.rdma_block_num), (96, 64));
    assert!(c.validate().is_ok());
}
