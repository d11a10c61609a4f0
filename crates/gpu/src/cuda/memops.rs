//! Stream memory operations: the parameters of `cuStreamBatchMemOp`.

use cudarc::driver::sys as cu;

use crate::types::StreamWrite;

/// `writes` as `cuStreamBatchMemOp`'s parameters (cuda.h, CUDA 13.0): one 48-byte
/// `CUstreamBatchMemOpParams` each, its `writeValue` member: `operation` (u32 at 0:
/// `CU_STREAM_MEM_OP_WRITE_VALUE_32` = 2 or `_64` = 5), `address` (8), `value` / `value64`
/// (16), `flags` (u32 at 24; 0: a memory fence before the write), `alias` (32, unused).
pub(crate) fn batch_writes(writes: &[StreamWrite]) -> Vec<[u64; 6]> {
    const WRITE_32: u64 = cu::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32 as u64;
    const WRITE_64: u64 = cu::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64 as u64;
    type W = cu::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st;
    const _: () = assert!(std::mem::size_of::<cu::CUstreamBatchMemOpParams>() == 48);
    const _: () = assert!(std::mem::offset_of!(W, operation) == 0 && std::mem::offset_of!(W, address) == 8);
    const _: () = assert!(std::mem::offset_of!(W, __bindgen_anon_1) == 16 && std::mem::offset_of!(W, flags) == 24);
    const _: () = assert!(std::mem::offset_of!(W, alias) == 32);
    writes
        .iter()
        .map(|w| match *w {
            StreamWrite::U32 { addr, value } => [WRITE_32, addr, value as u64, 0, 0, 0],
            StreamWrite::U64 { addr, value } => [WRITE_64, addr, value, 0, 0, 0],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_laid_out_as_cuda_13s_batch_parameters() {
        let p = batch_writes(&[StreamWrite::U64 { addr: 0x1000, value: 7 }, StreamWrite::U32 { addr: 0x2004, value: 9 }]);
        assert_eq!(p, vec![[5, 0x1000, 7, 0, 0, 0], [2, 0x2004, 9, 0, 0, 0]]);
    }
}
