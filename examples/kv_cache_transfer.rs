//! A prefill engine pushes one request's paged KV cache to a decode engine, shaped as
//! Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks, K and V apart.
//!
//! ```text
//! cargo run --release --example kv_cache_transfer [-- --tokens 4096 --pool-blocks N --lanes 4 --reps 5 --seed 1]
//! ```
//!
//! - Both engines live in this one process (two `IoEngine`s on 127.0.0.1, tcp backend with
//!   `--lanes` lanes); the bytes still cross real loopback sockets.
//! - Each side owns one pool buffer laid out `[layer][k/v][pool block][16 tok][8 heads][128]`
//!   bf16; one block is 32 KiB. The pool has `--pool-blocks` blocks per (layer, k/v), by
//!   default 1.5x the request's `ceil(tokens / 16)` blocks.
//! - The request's blocks sit at a random (seeded) subset of the prefill pool and go to a
//!   different random subset of the decode pool, as a block table shared by all layers.
//! - One `batch_write` carries every (layer, k/v, block) descriptor; after it, every byte of
//!   the decode pool is checked (request blocks equal their source, the rest untouched) and the
//!   decode engine must report the inbound transfer. Then `--reps` more transfers are timed
//!   (warm-up excluded). Any mismatch or error exits non-zero.

use mori::io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const LAYERS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK_TOKENS: usize = 16;
/// bf16 elements (stored as `u16`) in one block of one layer's K or V.
const BLOCK_ELEMS: usize = BLOCK_TOKENS * KV_HEADS * HEAD_DIM;
const BLOCK_BYTES: u64 = (BLOCK_ELEMS * 2) as u64;
const WAIT: Duration = Duration::from_secs(120);

/// Command-line settings.
struct Args {
    tokens: usize,
    pool_blocks: Option<usize>,
    lanes: usize,
    reps: usize,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { tokens: 4096, pool_blocks: None, lanes: 4, reps: 5, seed: 1 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            v.parse().map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
        };
        match flag.as_str() {
            "--tokens" => a.tokens = val()? as usize,
            "--pool-blocks" => a.pool_blocks = Some(val()? as usize),
            "--lanes" => a.lanes = val()? as usize,
            "--reps" => a.reps = val()? as usize,
            "--seed" => a.seed = val()?,
            _ => return Err(format!("unknown argument {flag:?} (flags: --tokens --pool-blocks --lanes --reps --seed)")),
        }
    }
    Ok(a)
}

/// splitmix64: a tiny deterministic generator, enough for shuffling block tables.
fn next_rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first `n` entries of a seeded random permutation of `0..pool`: a block table.
fn block_table(n: usize, pool: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..pool).collect();
    let mut s = seed;
    for i in (1..pool).rev() {
        p.swap(i, (next_rand(&mut s) % (i as u64 + 1)) as usize);
    }
    p.truncate(n);
    p
}

/// Mixes a global element index into a 16-bit value (the bf16 bit pattern we store).
fn mix(x: u64) -> u16 {
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

/// Value of (layer, k/v, token, head, dim) in the request's KV cache; `lkv = layer * 2 + kv`.
fn kv_value(lkv: usize, padded_tokens: usize, token: usize, head: usize, dim: usize) -> u16 {
    mix((((lkv * padded_tokens + token) * KV_HEADS + head) * HEAD_DIM + dim) as u64)
}

/// What a decode pool element holds before the transfer (and must keep if not in the request).
fn sentinel(elem: usize) -> u16 {
    mix(elem as u64 ^ 0x5EED_0000_0000) ^ 0xA5A5
}

/// One side's pool: the buffer, its engine and its registration.
struct Side {
    eng: IoEngine,
    pool: Vec<u16>,
    mem: MemoryDesc,
}

fn side(key: &str, pool: Vec<u16>, lanes: usize) -> mori::io::IoResult<Side> {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0)?)?;
    eng.create_backend(BackendConfig::Tcp(TcpConfig { lanes, ..TcpConfig::from_env()? }))?;
    let mut pool = pool;
    // SAFETY: the Vec is never resized or moved out of `Side` while registered (its heap buffer
    // stays put), it outlives the engine (fields drop in order, engine first), and this program
    // touches it only when no transfer is in flight (every transfer is waited for).
    let mem = unsafe { eng.register_memory(pool.as_mut_ptr().cast(), pool.len() * 2, MemLoc::Host { numa: None })? };
    Ok(Side { eng, pool, mem })
}

/// Checks every decode pool element; returns the number of wrong elements (printing the first).
fn verify(pre: &[u16], dec: &[u16], ptable: &[usize], dtable: &[usize], pool_blocks: usize) -> usize {
    let mut inverse = vec![None; pool_blocks];
    for (j, &d) in dtable.iter().enumerate() {
        inverse[d] = Some(ptable[j]);
    }
    let mut bad = 0;
    for lkv in 0..LAYERS * 2 {
        for (db, src) in inverse.iter().enumerate() {
            let at = (lkv * pool_blocks + db) * BLOCK_ELEMS;
            let got = &dec[at..at + BLOCK_ELEMS];
            let want: Vec<u16> = match src {
                // Fast path: a request block equal to its source block.
                Some(pb) if got == &pre[(lkv * pool_blocks + pb) * BLOCK_ELEMS..][..BLOCK_ELEMS] => continue,
                Some(pb) => pre[(lkv * pool_blocks + pb) * BLOCK_ELEMS..][..BLOCK_ELEMS].to_vec(),
                None => (at..at + BLOCK_ELEMS).map(sentinel).collect(),
            };
            for (e, (&v, &w)) in got.iter().zip(&want).enumerate().filter(|(_, (v, w))| v != w) {
                if bad == 0 {
                    let (t, h, d) = (e / (KV_HEADS * HEAD_DIM), e / HEAD_DIM % KV_HEADS, e % HEAD_DIM);
                    let what = if src.is_some() { "request" } else { "untouched" };
                    let kv = ["K", "V"][lkv % 2];
                    eprintln!("first mismatch: layer {} {kv} {what} decode pool block {db}, token {t} head {h} dim {d}: got {v:#06x}, want {w:#06x}", lkv / 2);
                }
                bad += 1;
            }
        }
    }
    bad
}

/// Waits (bounded) until the decode engine reports inbound transfer `id` from "prefill".
fn inbound_ok(dec: &IoEngine, id: u64) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Some(r) = dec.pop_inbound_status("prefill", id) {
            return r.map_err(|e| format!("decode side reports transfer {id} failed: {e}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!("decode side never reported inbound transfer {id} within 10 s"))
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    let blocks = a.tokens.div_ceil(BLOCK_TOKENS);
    let pool_blocks = a.pool_blocks.unwrap_or(blocks + blocks / 2);
    if blocks == 0 || pool_blocks < blocks {
        return Err(format!("need 1 <= blocks ({blocks}) <= --pool-blocks ({pool_blocks})"));
    }
    let padded = blocks * BLOCK_TOKENS;
    let pool_elems = LAYERS * 2 * pool_blocks * BLOCK_ELEMS;
    let request_bytes = (LAYERS * 2 * blocks) as u64 * BLOCK_BYTES;
    println!(
        "shape: {LAYERS} layers x K/V x {KV_HEADS} kv heads x head dim {HEAD_DIM}, bf16, {BLOCK_TOKENS}-token blocks of {} KiB",
        BLOCK_BYTES >> 10
    );
    println!(
        "request: {} tokens = {blocks} blocks per layer per K/V; pool: {pool_blocks} blocks per layer per K/V ({} MiB per side); tcp lanes: {}",
        a.tokens,
        (pool_elems * 2) >> 20,
        a.lanes
    );

    // Block tables: logical block j lives at prefill pool block ptable[j], goes to dtable[j].
    let ptable = block_table(blocks, pool_blocks, a.seed);
    let dtable = block_table(blocks, pool_blocks, a.seed ^ 0xDEC0DE);
    let mut pre = vec![0xFFFFu16; pool_elems];
    for lkv in 0..LAYERS * 2 {
        for (j, &pb) in ptable.iter().enumerate() {
            let blk = &mut pre[(lkv * pool_blocks + pb) * BLOCK_ELEMS..][..BLOCK_ELEMS];
            for (e, v) in blk.iter_mut().enumerate() {
                let (t, h, d) = (e / (KV_HEADS * HEAD_DIM), e / HEAD_DIM % KV_HEADS, e % HEAD_DIM);
                *v = kv_value(lkv, padded, j * BLOCK_TOKENS + t, h, d);
            }
        }
    }
    let dec_init: Vec<u16> = (0..pool_elems).map(sentinel).collect();

    let err = |e: mori::io::IoError| e.to_string();
    let prefill = side("prefill", pre, a.lanes).map_err(err)?;
    let decode = side("decode", dec_init, a.lanes).map_err(err)?;
    prefill.eng.register_remote_engine(decode.eng.desc().clone()).map_err(err)?;
    decode.eng.register_remote_engine(prefill.eng.desc().clone()).map_err(err)?;
    let sess = prefill.eng.create_session(&prefill.mem, &decode.mem).map_err(err)?;

    // One descriptor per (layer, k/v, block), in that order.
    let (mut lo, mut ro) = (Vec::new(), Vec::new());
    for lkv in 0..LAYERS * 2 {
        for j in 0..blocks {
            lo.push((lkv * pool_blocks + ptable[j]) as u64 * BLOCK_BYTES);
            ro.push((lkv * pool_blocks + dtable[j]) as u64 * BLOCK_BYTES);
        }
    }
    let sizes = vec![BLOCK_BYTES; lo.len()];
    let runs = 1 + (1..lo.len()).filter(|&i| lo[i] != lo[i - 1] + BLOCK_BYTES || ro[i] != ro[i - 1] + BLOCK_BYTES).count();

    let transfer = || -> Result<f64, String> {
        let id = prefill.eng.allocate_transfer_uid();
        let t0 = Instant::now();
        sess.batch_write(&lo, &ro, &sizes, id).wait_for(WAIT).map_err(err)?;
        let secs = t0.elapsed().as_secs_f64();
        inbound_ok(&decode.eng, id)?;
        Ok(secs)
    };
    let gbps = |secs: f64| request_bytes as f64 / secs / 1e9;

    let secs = transfer()?;
    println!("descriptors: {} ({runs} contiguous runs after merging)", lo.len());
    println!("bytes: {request_bytes} ({} MiB)", request_bytes >> 20);
    println!("first transfer: {secs:.4} s, {:.2} GB/s", gbps(secs));
    println!("decode engine reported the inbound transfer: ok");
    let bad = verify(&prefill.pool, &decode.pool, &ptable, &dtable, pool_blocks);
    if bad != 0 {
        return Err(format!("{bad} of {pool_elems} decode pool elements are wrong"));
    }
    println!("verified: every byte OK ({} MiB of decode pool checked)", (pool_elems * 2) >> 20);

    if a.reps > 0 {
        let times = (0..a.reps).map(|_| transfer()).collect::<Result<Vec<f64>, String>>()?;
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
        println!(
            "warm ({} reps, first excluded): mean {mean:.4} s = {:.2} GB/s, best {best:.4} s = {:.2} GB/s",
            a.reps,
            gbps(mean),
            gbps(best)
        );
        let bad = verify(&prefill.pool, &decode.pool, &ptable, &dtable, pool_blocks);
        if bad != 0 {
            return Err(format!("after the repetitions, {bad} of {pool_elems} decode pool elements are wrong"));
        }
        println!("verified again after the repetitions: every byte OK");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv_cache_transfer: {e}");
            ExitCode::FAILURE
        }
    }
}
