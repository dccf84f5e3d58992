// Writes a shopping cart's events through Emmett's own PostgreSQL event store
// (npm @event-driven-io/emmett-postgresql), as an application does: the store creates
// its schema (emt_messages and the rest) on first use, then each appendToStream is one
// transaction. Used by tests/tests/e2e/frameworks/emmett.rs; the statements are Emmett's.
//
//   node write.mjs <connection string> schema   # create the schema only
//   node write.mjs <connection string> events   # append the test's events
import { getPostgreSQLEventStore } from '@event-driven-io/emmett-postgresql';

const [url, what] = process.argv.slice(2);
const store = getPostgreSQLEventStore(url);
const cart = (n) => `shopping_cart-6f0c0a4e-1d2b-4c3a-9e8f-00000000000${n}`;
const added = (productId, quantity, unitPrice) => ({
  type: 'ProductItemAddedToShoppingCart',
  data: { productItem: { productId, quantity, unitPrice } },
});
const removed = (productId, quantity, unitPrice) => ({
  type: 'ProductItemRemovedFromShoppingCart',
  data: { productItem: { productId, quantity, unitPrice } },
});

try {
  if (what === 'schema') {
    await store.schema.migrate();
  } else {
    await store.appendToStream(cart(1), [added('shoes', 2, 50), added('socks', 3, 5)]);
    await store.appendToStream(cart(2), [added('hat', 1, 20)]);
    await store.appendToStream(cart(1), [removed('socks', 1, 5)]);
    await store.appendToStream(cart(2), [
      added('scarf', 2, 15),
      { type: 'ShoppingCartConfirmed', data: { confirmedAt: '2026-12-07T23:50:00.000Z' } },
    ]);
    // A command, stored in the same table (message_kind 'C') in a stream of its own: no
    // event. (In an aggregate's own stream it would take a stream_position, a gap in
    // its events' versions that a strict projection waits on.)
    await store.appendToStream('shopping_cart_commands-6f0c0a4e-1d2b-4c3a-9e8f-000000000003', [
      { kind: 'Command', type: 'ConfirmShoppingCart', data: { shoppingCartId: cart(3) } },
    ]);
    await store.appendToStream(cart(3), [added('gloves', 1, 12.5)]);
  }
} finally {
  await store.close();
}
