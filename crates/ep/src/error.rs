//! Typed errors of MORI-EP. Every variant names the input (and rank) at fault and the
//! limit it broke, so a caller can fix its inputs without reading this crate's source.

/// Result alias used throughout `mori-ep`.
pub type EpResult<T> = Result<T, EpError>;

/// Everything that can go wrong in configuration, layout, dispatch, combine and accounting.
///
/// No function of this crate panics on input; each rejects it with one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpError {
    /// A configuration field has a value outside its documented domain.
    #[error("config: {field} = {value} is invalid: {reason}")]
    InvalidConfig {
        /// Field name as in [`crate::EpConfig`].
        field: &'static str,
        /// The offending value, printed.
        value: String,
        /// What the domain is.
        reason: String,
    },
    /// `top_k` (experts per token) is above [`crate::MAX_TOP_K`].
    #[error("config: top_k = {top_k} exceeds the limit {limit} (one token's slots must fit one 32-lane warp)")]
    TopKTooLarge {
        /// Requested top-k.
        top_k: usize,
        /// The limit, [`crate::MAX_TOP_K`].
        limit: usize,
    },
    /// A token row's byte size is not a multiple of 16 (the kernels move 16-byte vectors).
    #[error("{what}: hidden = {hidden} elements x {elem_size} B = {bytes} B is not a multiple of 16 B")]
    HiddenBytesNotAligned {
        /// Which size was checked (`"config max_token_type_size"` or the input tensor).
        what: &'static str,
        /// Hidden size in elements.
        hidden: usize,
        /// Element size in bytes.
        elem_size: usize,
        /// hidden x elem_size.
        bytes: usize,
    },
    /// The total expert count does not split evenly over the ranks.
    #[error("num_experts = {num_experts} is not divisible by world_size = {world}")]
    ExpertsNotDivisible {
        /// Total experts E.
        num_experts: usize,
        /// World size.
        world: usize,
    },
    /// `max_recv_tokens` cannot hold what a rank may receive in the worst case.
    #[error("config: max_recv_tokens = {max_recv_tokens} is smaller than world_size x max_tokens_per_rank = {required}; a rank could receive more tokens than its buffer holds")]
    RecvBufferTooSmall {
        /// Configured receive capacity in tokens.
        max_recv_tokens: usize,
        /// world_size x max_tokens_per_rank.
        required: usize,
    },
    /// A derived size (buffer bytes, flat source index) does not fit its integer type.
    #[error("{what} overflows {limit}")]
    SizeOverflow {
        /// The size being computed.
        what: &'static str,
        /// The type or bound it exceeds.
        limit: &'static str,
    },
    /// A tensor's data length disagrees with its declared shape.
    #[error("tensor data has {len} elements, shape [{rows}, {cols}] needs {}", rows.saturating_mul(*cols))]
    TensorData {
        /// Declared rows.
        rows: usize,
        /// Declared columns.
        cols: usize,
        /// Actual element count.
        len: usize,
    },
    /// An input tensor of one rank has the wrong shape.
    #[error("{input} on rank {rank}: expected shape [{exp_rows}, {exp_cols}], got [{rows}, {cols}]")]
    Shape {
        /// Input name (`"x"`, `"weights"`, `"scales"`, `"indices"`, `"combine x"`, ...).
        input: &'static str,
        /// Rank whose input it is.
        rank: usize,
        /// Expected rows.
        exp_rows: usize,
        /// Expected columns.
        exp_cols: usize,
        /// Actual rows.
        rows: usize,
        /// Actual columns.
        cols: usize,
    },
    /// A per-rank input list has the wrong number of ranks.
    #[error("{input}: expected one entry per rank ({expected}), got {got}")]
    RankCount {
        /// Input name.
        input: &'static str,
        /// world_size.
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// Scales were given without `scale_dim > 0`, or are missing although `scale_dim > 0`.
    #[error("scales on rank {rank}: config scale_dim = {scale_dim} but scales were {}", if *given { "given" } else { "not given" })]
    ScalesPresence {
        /// Rank.
        rank: usize,
        /// Configured scale_dim.
        scale_dim: usize,
        /// Whether the rank passed scales.
        given: bool,
    },
    /// An element type's size disagrees with the configuration.
    #[error("{input}: element size {got} B {relation} {limit} B from config {field}")]
    ElementSize {
        /// Input name.
        input: &'static str,
        /// Size of the element type passed.
        got: usize,
        /// `"exceeds"` or `"differs from"`.
        relation: &'static str,
        /// The configured size.
        limit: usize,
        /// Config field name.
        field: &'static str,
    },
    /// A rank holds more tokens than the configured maximum.
    #[error("rank {rank} holds {tokens} tokens, more than max_tokens_per_rank = {limit}")]
    TooManyTokens {
        /// Rank.
        rank: usize,
        /// Tokens given.
        tokens: usize,
        /// max_tokens_per_rank.
        limit: usize,
    },
    /// An expert id is neither -1 nor in `[0, num_experts)`.
    #[error("indices on rank {rank}, token {token}, slot {slot}: expert id {expert} is out of range [0, {num_experts}) (-1 means none; OutOfRange::Drop skips such ids)")]
    ExpertOutOfRange {
        /// Source rank.
        rank: usize,
        /// Token row.
        token: usize,
        /// Top-k slot.
        slot: usize,
        /// The id.
        expert: i64,
        /// Total experts E.
        num_experts: usize,
    },
    /// A rank would receive more tokens than its receive buffer holds.
    #[error("rank {rank} would receive {received} tokens, more than max_recv_tokens = {limit}")]
    RecvOverflow {
        /// Receiving rank.
        rank: usize,
        /// Tokens it would receive.
        received: usize,
        /// max_recv_tokens.
        limit: usize,
    },
    /// Combine was given indices shaped like dispatch's output instead of the original routing.
    #[error("combine indices on rank {rank} have {rows} rows = the {rows} tokens it received, not its {tokens} original tokens: pass the original (pre-dispatch) top-k indices, not dispatch's output indices")]
    IndicesLookLikeDispatchOutput {
        /// Rank.
        rank: usize,
        /// Rows of the indices passed.
        rows: usize,
        /// The rank's original token count.
        tokens: usize,
    },
    /// Combine's indices route a token to other ranks than dispatch delivered it to.
    #[error("combine indices on rank {rank}, token {token}: route it to ranks {routed:?} but dispatch delivered it to ranks {delivered:?}: pass the same original top-k indices that were dispatched")]
    RoutingMismatch {
        /// Source rank.
        rank: usize,
        /// Token row.
        token: usize,
        /// Ranks the given indices name (deduplicated, ascending).
        routed: Vec<usize>,
        /// Ranks that received it in dispatch (ascending).
        delivered: Vec<usize>,
    },
    /// Weighted combine was requested without weights.
    #[error("combine: weighting {weighting} needs per-rank weights, none were given")]
    WeightsRequired {
        /// The weighting mode requested.
        weighting: &'static str,
    },
    /// A received-token list names the same source twice, or a source that does not exist.
    #[error("received tokens on rank {rank}, row {row}: source (rank {src_rank}, token {src_token}) {problem}")]
    BadSource {
        /// Receiving rank.
        rank: usize,
        /// Row in its received list.
        row: usize,
        /// Source rank.
        src_rank: usize,
        /// Source token.
        src_token: usize,
        /// `"appears twice"` or `"does not exist"`.
        problem: &'static str,
    },
    /// A segment of a rank's inter-node window announced more entries than it can hold
    /// (a writer over its capacity: refused before anything past the segment is read).
    #[error("rank {rank}: {segment} written by rank {writer} announces {entries} entries, its capacity is {capacity}")]
    SegmentOverflow {
        /// Receiving rank.
        rank: usize,
        /// The segment, named as in the window layout.
        segment: String,
        /// The rank that writes it.
        writer: usize,
        /// Entries announced (or arrived).
        entries: usize,
        /// Entries the segment holds.
        capacity: usize,
    },
    /// A peer's inter-node record contradicts the protocol (wrong source, unknown token,
    /// rows out of order): a corrupted or foreign writer.
    #[error("rank {rank}: protocol violation in {segment} written by rank {writer}: {detail}")]
    Protocol {
        /// Receiving rank.
        rank: usize,
        /// The segment.
        segment: String,
        /// The rank that writes it.
        writer: usize,
        /// What was wrong.
        detail: String,
    },
    /// The host executor could not set up or use a resource (shared memory, the bootstrap,
    /// a MORI-IO engine).
    #[error("host executor: {what}: {detail}")]
    Host {
        /// What failed (the call and the object).
        what: String,
        /// The underlying error.
        detail: String,
    },
    /// A rank's phase did not complete within its deadline.
    #[error("rank {rank}: {phase} not complete after {waited_ms} ms: missing writes from ranks {writers:?}; still waiting for {waiting}")]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// `"dispatch"` or `"combine"`.
        phase: &'static str,
        /// The deadline, ms.
        waited_ms: u64,
        /// The segments still missing.
        waiting: String,
        /// The other ranks that write them (never `rank` itself; sorted).
        writers: Vec<usize>,
    },
    /// An inter-node write of a rank to a peer failed.
    #[error("rank {rank}: inter-node write to rank {peer} failed: {detail}")]
    Transport {
        /// The writing rank.
        rank: usize,
        /// The destination rank (`usize::MAX` when unknown).
        peer: usize,
        /// The transport's error.
        detail: String,
    },
    /// A rank on another node whose writes this rank still waited for closed every connection
    /// it had to this rank's engine (its process exited, was killed, or closed its engine):
    /// its writes cannot come. Seen for a writer that connected before: over tcp its data
    /// lanes and its control connection, over rdma the control connection its signals use
    /// ([`mori_io::IoEngine::closed_by_peer`]).
    #[error("rank {rank}: {phase}: rank {peer} closed its connections while its writes were still missing (its process exited, was killed, or closed its engine: see that process's own error); still waiting for {waiting}")]
    PeerLost {
        /// The waiting rank.
        rank: usize,
        /// `"dispatch"` or `"combine"`.
        phase: &'static str,
        /// The rank that closed its connections.
        peer: usize,
        /// The segments still missing (the first six, with their writers).
        waiting: String,
    },
    /// Two processes of one job run different configurations.
    #[error("rank {rank} has {field} = {mine} but rank {peer} has {field} = {theirs}: every rank must use the same configuration")]
    PeerMismatch {
        /// A rank of this process.
        rank: usize,
        /// The differing field.
        field: String,
        /// This process's value.
        mine: String,
        /// The peer rank.
        peer: usize,
        /// The peer's value.
        theirs: String,
    },
    /// A step of one rank's inter-node combine was given another element type than its start
    /// (`internode::CombineRank::poll` / `finish` against `start`).
    #[error("combine on rank {rank}: {step} was given element type {got:?}, its start {started:?}: one combine runs in one element type")]
    CombineElementType {
        /// The rank.
        rank: usize,
        /// The step (`poll` or `finish`).
        step: &'static str,
        /// The element type the step was given.
        got: crate::dtype::DType,
        /// The element type `start` was given.
        started: crate::dtype::DType,
    },
    /// A combine row or partial another rank wrote names another element type than this rank's
    /// combine: processes of one job combined in different types (its values would be decoded at
    /// the wrong width).
    #[error("combine on rank {rank}: {segment} written by rank {writer} holds {theirs:?} values, this rank combines {mine:?}: every rank of a combine must use one element type")]
    PeerElementType {
        /// The reading rank.
        rank: usize,
        /// The segment the row or partial is in.
        segment: String,
        /// The rank that wrote it.
        writer: usize,
        /// The writer's combine element type.
        theirs: crate::dtype::DType,
        /// This rank's combine element type.
        mine: crate::dtype::DType,
    },
    /// Another rank of the job gave up (a failed write, a missed deadline) and told this one.
    #[error("rank {rank}: {phase} aborted: {}", peer_failed_msg(*.failed, *.reporter, *.seen_dead))]
    PeerFailed {
        /// This rank.
        rank: usize,
        /// `"dispatch"` or `"combine"`.
        phase: &'static str,
        /// The rank found failed (`seen_dead`), or whose writes the reporter timed out on.
        failed: usize,
        /// The rank that found it.
        reporter: usize,
        /// Whether the reporter saw `failed` fail (connection lost, a write to it failed); false
        /// when it only timed out waiting for its writes.
        seen_dead: bool,
    },
}

fn peer_failed_msg(failed: usize, reporter: usize, seen_dead: bool) -> String {
    if seen_dead {
        format!("rank {failed} failed (rank {reporter} saw its connection lost or a write to it fail)")
    } else {
        format!("rank {reporter} timed out missing writes from rank {failed} (not seen to fail: stopped, slow, or waiting itself)")
    }
}
