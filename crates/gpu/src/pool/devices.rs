//! A device's pool on first use (its streams, slots, kernels, armed launches and resident
//! copier) and the admission of a submission to one of its slots.

use super::*;

impl Shared {
    pub(super) fn dev_pool(&self, dev: Device) -> Result<&DevPool> {
        let cell = self
            .devs
            .get(dev.0 as usize)
            .ok_or_else(|| GpuError::invalid(format!("copy pool: {dev} does not exist ({} device(s) present)", self.devs.len())))?;
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let _creating = self.dev_init.lock();
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let streams = (0..self.cfg.num_streams).map(|_| self.rt.stream(dev)).collect::<Result<Vec<_>>>()?;
        let mut flags = match self.cfg.host_flags {
            Some(true) => match flags::alloc(&self.rt, dev, self.cfg.num_events) {
                Ok(f) => f.into_iter().map(Some).collect(),
                Err(e) => {
                    flags::warn_once(
                        &flags::SAID_ALLOC_FAILED,
                        &format!("completion flags unavailable on {dev} ({e}): its completions are told by events"),
                    );
                    Vec::new()
                }
            },
            _ => Vec::new(),
        };
        flags.resize_with(self.cfg.num_events, || None);
        let Kernels { sg: kernel, paged, ordered, armed: armed_fn, resident: resident_fn } =
            if self.cfg.kernel_threshold > 0 { self.load_kernels(dev) } else { Kernels::default() };
        let arrivals = match ordered.as_ref().filter(|_| self.cfg.ordered_kernel == Some(true)) {
            Some(_) => match ordered::alloc_arrivals(&self.rt, dev, self.cfg.num_events) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(device = dev.0, error = %e, "copy pool: no arrival words: ordered batches are queued as one copy per segment");
                    None
                }
            },
            None => None,
        };
        let mut slots = Vec::with_capacity(self.cfg.num_events);
        for (i, flag) in flags.into_iter().enumerate() {
            slots.push(Slot {
                event: self.rt.event(dev, false)?,
                scratch: Mutex::new(None),
                staging: Mutex::new(None),
                flag,
                arrivals: arrivals.as_ref().map(|b| (b.clone(), i)),
                retired: AtomicBool::new(false),
            });
        }
        let ordered = ordered.filter(|_| arrivals.is_some());
        let sms = self.rt.device_properties(dev)?.multiprocessors.max(1);
        let armed = self.arm(dev, ordered.is_some(), armed_fn, sms);
        let resident = self.resident(dev, ordered.is_some() && slots.iter().all(|s| s.flag.is_some()), resident_fn, sms);
        Ok(cell.get_or_init(|| DevPool {
            resident,
            armed,
            device: dev,
            kernel,
            paged,
            ordered,
            sms,
            busy: streams.iter().map(|_| AtomicUsize::new(0)).collect(),
            streams,
            next: AtomicUsize::new(0),
            free: Mutex::new((0..slots.len()).rev().collect()),
            retired: AtomicUsize::new(0),
            flags_failed: AtomicBool::new(false),
            slots,
        }))
    }

    /// The scatter/gather, paged-copy, ordered-copy, armed and resident ordered-copy kernels
    /// on `dev` (one module); all none (logged) if no image loads or any is missing, and
    /// batches then use one copy per segment, paged copies one copy per range.
    fn load_kernels(&self, dev: Device) -> Kernels {
        let images = KernelImages { cubin: SG_CUBIN, ptx: SG_PTX, hsaco: SG_GFX942 };
        let loaded = images.load(&*self.rt, dev).and_then(|m| {
            Ok(Kernels {
                sg: Some(m.function("mori_scatter_gather_copy")?),
                paged: Some(paged::PagedKernels { table: m.function("mori_paged_copy")?, inline: m.function("mori_paged_copy_inline")? }),
                ordered: Some(m.function("mori_ordered_copy")?),
                armed: Some(m.function("mori_ordered_copy_armed")?),
                resident: Some(m.function("mori_ordered_copy_resident")?),
            })
        });
        match loaded {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(
                    device = dev.0,
                    error = %e,
                    "no scatter/gather kernels: batches use one copy per segment, paged copies one per range"
                );
                Kernels::default()
            }
        }
    }

    /// `dev`'s resident copier when [`CopyPoolConfig::resident_blocks`] asks for one and the
    /// ordered-copy kernel and flags are in use (`usable`); the path taken is logged either way.
    fn resident(&self, dev: Device, usable: bool, f: Option<Function>, sms: u32) -> Option<resident::Resident> {
        let blocks = self.cfg.resident_blocks;
        if blocks == 0 {
            return None;
        }
        let Some(f) = f.filter(|_| usable) else {
            tracing::warn!(device = dev.0, "copy pool: a resident copier of {blocks} blocks asked for, but ordered batches do not use the ordered-copy kernel with flags here: each is launched when posted");
            return None;
        };
        match resident::Resident::new(
            &self.rt,
            dev,
            f,
            (blocks, self.cfg.resident_idle, self.cfg.resident_carveout),
            sms,
            self.cfg.num_events,
        ) {
            Ok(r) => {
                tracing::info!(
                    device = dev.0,
                    blocks = r.grid(),
                    carveout = self.cfg.resident_carveout,
                    "copy pool: ordered batches go to a resident copier (no driver call to post one)"
                );
                Some(r)
            }
            Err(e) => {
                tracing::warn!(device = dev.0, error = %e, "copy pool: no resident copier: ordered batches are launched when posted");
                None
            }
        }
    }

    /// `dev`'s armed launches when [`CopyPoolConfig::armed_depth`] asks for them and the
    /// ordered-copy kernel is in use; the path taken is logged either way.
    fn arm(&self, dev: Device, ordered: bool, f: Option<Function>, sms: u32) -> Option<armed::Armed> {
        let depth = self.cfg.armed_depth;
        if depth == 0 {
            return None;
        }
        let Some(f) = f.filter(|_| ordered) else {
            tracing::warn!(device = dev.0, "copy pool: {depth} armed launches asked for, but ordered batches do not use the ordered-copy kernel here: each is queued when posted");
            return None;
        };
        match armed::Armed::new(&self.rt, dev, f, depth, sms) {
            Ok(a) => {
                tracing::info!(
                    device = dev.0,
                    depth,
                    grid = armed::grid(sms),
                    "copy pool: ordered batches fire armed launches (no driver call to post one)"
                );
                Some(a)
            }
            Err(e) => {
                tracing::warn!(device = dev.0, error = %e, "copy pool: no armed launches: ordered batches are launched when posted");
                None
            }
        }
    }

    /// A free slot of `dp`; waits (`admission_timeout` at most) while all are in flight,
    /// running completion steps meanwhile.
    pub(super) fn take_slot(&self, dp: &DevPool) -> Result<usize> {
        if let Some(i) = dp.free.lock().pop() {
            return Ok(i);
        }
        let t0 = Instant::now();
        loop {
            if let Some(mut mine) = self.reap.try_lock() {
                self.reap_once(&mut mine);
            }
            if let Some(i) = dp.free.lock().pop() {
                return Ok(i);
            }
            let retired = dp.retired.load(Ordering::Acquire);
            if retired >= dp.slots.len() || t0.elapsed() > self.cfg.admission_timeout {
                let why = if retired >= dp.slots.len() {
                    format!(
                        "all {retired} event slots of {} were retired (failed event records, or resident-copier tables failed that may still run)",
                        dp.device
                    )
                } else {
                    format!(
                        "{} submissions still in flight on {} after {:?} ({retired} slot(s) retired: failed event records, or resident-copier tables failed that may still run)",
                        dp.slots.len() - retired,
                        dp.device,
                        self.cfg.admission_timeout
                    )
                };
                return Err(GpuError::timed_out("copy pool admission", why));
            }
            std::thread::yield_now();
        }
    }
}
