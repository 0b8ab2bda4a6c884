//! Stacks interned by content and reference counted by the store's entries,
//! so a stack seen in every second of the retention window is kept once.

use std::{collections::HashMap, sync::Arc};

use crate::{shares::Owner, symbolize::SymbolizedStack};

pub type StackId = u32;

struct Slot {
    stack: Arc<SymbolizedStack>,
    refs: u32,
    /// Whose share its bytes are charged to: whoever brought it in (a stack
    /// someone else's entries share costs its first owner nothing more).
    owner: Owner,
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
    /// stack is new to the table (and then charged to `owner`).
    pub fn acquire(&mut self, stack: &Arc<SymbolizedStack>, owner: Owner) -> (StackId, bool) {
        if let Some(&id) = self.ids.get(stack) {
            if let Some(slot) = &mut self.slots[id as usize] {
                slot.refs += 1;
            }
            return (id, false);
        }
        let slot = Slot {
            stack: stack.clone(),
            refs: 1,
            owner,
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

    /// The id of a stack of this content, if the table holds one.
    pub fn id_of(&self, stack: &Arc<SymbolizedStack>) -> Option<StackId> {
        self.ids.get(stack).copied()
    }

    pub fn add_ref(&mut self, id: StackId) {
        if let Some(Some(slot)) = self.slots.get_mut(id as usize) {
            slot.refs += 1;
        }
    }

    /// Drops a reference; a stack freed by it returns whom it was charged
    /// to and its bytes.
    pub fn release(&mut self, id: StackId) -> Option<(Owner, usize)> {
        let slot = self.slots.get_mut(id as usize)?.as_mut()?;
        slot.refs -= 1;
        if slot.refs > 0 {
            return None;
        }
        let slot = self.slots[id as usize].take()?;
        self.ids.remove(&slot.stack);
        let bytes = slot.stack.approx_bytes();
        self.bytes -= bytes;
        self.free.push(id);
        Some((slot.owner, bytes))
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
