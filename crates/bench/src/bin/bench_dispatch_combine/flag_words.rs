//! Configuration errors in the words of this bench's flags: `EpConfig`'s checks and the GPU
//! objects' name their own fields (`warps_per_block = 99`), which the user typed as flags
//! (`--warps-per-block 99`).

use mori_ep::gpu::EpGpuError;
use mori_ep::EpError;
use std::error::Error;

/// The flag that sets a field of `EpConfig` or of the GPU objects' launch checks, where one flag
/// sets it alone.
fn flag_of(field: &str) -> Option<&'static str> {
    Some(match field {
        "world_size" => "--world-size",
        "hidden" => "--hidden",
        "top_k" => "--top-k",
        "block_num" | "blocks per rank" => "--block-num",
        "warps_per_block" => "--warps-per-block",
        "gpus_per_node" => "--gpus-per-node",
        "max_tokens_per_rank" => "--num-tokens",
        _ => return None,
    })
}

/// `e` reworded around the flag that set the value at fault (`--top-k 99: must be ...`), or
/// `None` when `e` is no configuration error of a single flag's value (it is then printed as
/// it is).
pub fn reworded(e: &(dyn Error + 'static)) -> Option<String> {
    let ep = match e.downcast_ref::<EpGpuError>() {
        Some(EpGpuError::Ep(x)) => x,
        Some(_) => return None,
        None => e.downcast_ref::<EpError>()?,
    };
    match ep {
        EpError::InvalidConfig { field, value, reason } => flag_of(field).map(|flag| format!("{flag} {value}: {reason}")),
        EpError::TopKTooLarge { top_k, limit } => {
            Some(format!("--top-k {top_k} exceeds the limit {limit} (one token's slots must fit one 32-lane warp)"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::reworded;
    use mori_ep::gpu::EpGpuError;
    use mori_ep::EpError;

    fn boxed(e: impl std::error::Error + 'static) -> Box<dyn std::error::Error> {
        Box::new(e)
    }

    #[test]
    fn config_errors_name_the_flags() {
        let inv = |field, value: &str, reason: &str| EpError::InvalidConfig { field, value: value.into(), reason: reason.into() };
        let e = boxed(inv("warps_per_block", "99", "must be at most 32 (1024 threads)"));
        assert_eq!(reworded(e.as_ref()).as_deref(), Some("--warps-per-block 99: must be at most 32 (1024 threads)"));
        let e = boxed(EpGpuError::Ep(inv("blocks per rank", "32", "8 ranks x 32 blocks = 256 blocks")));
        assert_eq!(reworded(e.as_ref()).as_deref(), Some("--block-num 32: 8 ranks x 32 blocks = 256 blocks"));
        let e = boxed(EpError::TopKTooLarge { top_k: 40, limit: 32 });
        assert!(reworded(e.as_ref()).is_some_and(|m| m.starts_with("--top-k 40 exceeds the limit 32")));
        // Fields no single flag sets, and other errors, stay as they are.
        assert_eq!(reworded(boxed(inv("rdma_block_num", "0", "x")).as_ref()), None);
        assert_eq!(reworded(boxed(std::io::Error::other("no GPU")).as_ref()), None);
    }
}
