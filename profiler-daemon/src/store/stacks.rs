//! Stacks interned by content and reference counted by the store's entries,
//! so a stack seen in every second of the retention window is kept once.

use std::{collections::HashMap, sync::Arc};

use crate::symbolize::SymbolizedStack;

pub type StackId = u32;

struct Slot {
    stack: Arc<SymbolizedStack>,
    refs: u32,
}

#[derive(Default)]
pub struct StackTable {
    slots: Vec<Option<Slot>>,
    free: Vec<StackId>,
    ids: HashMap<Arc<SymbolizedStack>, StackId>,
    bytes: usize,
}

impl StackTable {
    /// Returns the stack's id and adds a reference; the bool is true when the
    /// stack is new to the table.
    pub fn acquire(&mut self, stack: &Arc<SymbolizedStack>) -> (StackId, bool) {
        if let Some(&id) = self.ids.get(stack) {
            if let Some(slot) = &mut self.slots[id as usize] {
                slot.refs += 1;
            }
            return (id, false);
        }
        let slot = Slot {
            stack: stack.clone(),
            refs: 1,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as StackId
            }
        };
        self.ids.insert(stack.clone(), id);
        self.bytes += stack.approx_bytes();
        (id, true)
    }

    pub fn add_ref(&mut self, id: StackId) {
        if let Some(Some(slot)) = self.slots.get_mut(id as usize) {
            slot.refs += 1;
        }
    }

    pub fn release(&mut self, id: StackId) {
        let Some(Some(slot)) = self.slots.get_mut(id as usize) else {
            return;
        };
        slot.refs -= 1;
        if slot.refs == 0 {
            let slot = self.slots[id as usize].take().expect("slot checked above");
            self.ids.remove(&slot.stack);
            self.bytes -= slot.stack.approx_bytes();
            self.free.push(id);
        }
    }

    pub fn get(&self, id: StackId) -> Option<&Arc<SymbolizedStack>> {
        self.slots.get(id as usize)?.as_ref().map(|slot| &slot.stack)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
