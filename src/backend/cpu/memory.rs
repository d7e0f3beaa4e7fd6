//! Host allocations standing in for device memory on the CPU backend.

use std::alloc::Layout;
use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::{ensure, err, Result};

/// Alignment of every allocation, matching what GPU allocators guarantee.
const ALIGN: usize = 256;

/// Live allocations by address, so `free` can recover the layout and reject
/// pointers this backend did not hand out.
#[derive(Debug, Default)]
pub struct HostAllocations {
    live: Mutex<HashMap<usize, Layout>>,
}

impl HostAllocations {
    pub fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|_| err!(OutOfMemory, "bytes: {bytes} is too large"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        ensure!(
            !ptr.is_null(),
            OutOfMemory,
            "bytes: cannot allocate {bytes} bytes"
        );
        self.live.lock().insert(ptr as usize, layout);
        Ok(ptr)
    }

    /// # Safety
    /// `ptr` is not used after this call.
    pub unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let layout = self.live.lock().remove(&(ptr as usize));
        let Some(layout) = layout else {
            return Err(err!(
                InvalidArgument,
                "ptr: {ptr:p} was not allocated by this context"
            ));
        };
        std::alloc::dealloc(ptr, layout);
        Ok(())
    }
}

impl Drop for HostAllocations {
    fn drop(&mut self) {
        for (ptr, layout) in self.live.get_mut().drain() {
            // SAFETY: still-live allocations of this backend; the context that
            // owned them is being destroyed.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
}
