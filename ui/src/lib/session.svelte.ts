// Who is signed in (NodeService/WhoAmI), and their user id: what jobs carry as `owner`.

import { whoAmI } from './api';
import type { WhoAmI } from './types';

export const session = $state<{ me: WhoAmI | undefined; myUserId: string | undefined; loaded: boolean }>({
  me: undefined,
  myUserId: undefined,
  loaded: false,
});

export async function loadSession(): Promise<void> {
  let me: WhoAmI | undefined;
  try {
    me = await whoAmI();
  } catch {
    me = undefined;
  }
  setSession(me);
}

export function setSession(me: WhoAmI | undefined): void {
  session.me = me;
  session.loaded = true;
  session.myUserId = me?.userId || undefined;
}
