import { ComponentChildren } from 'preact';
import { useEffect, useRef } from 'preact/hooks';

export function ErrorBox({ error }: { error: string | null }) {
  if (!error) return null;
  return (
    <div class="error" role="alert" data-testid="error">
      {error}
    </div>
  );
}

/** A confirmation dialog (a real <dialog>, modal). */
export function Confirm(props: {
  title: string;
  children: ComponentChildren;
  confirmLabel: string;
  onConfirm: () => void;
  onCancel: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
  }, []);
  return (
    <dialog ref={ref} class="confirm" data-testid="confirm" onCancel={props.onCancel}>
      <h3>{props.title}</h3>
      <div>{props.children}</div>
      <div class="buttons">
        <button type="button" onClick={props.onCancel}>
          Cancel
        </button>
        <button type="button" class="danger" data-testid="confirm-yes" onClick={props.onConfirm}>
          {props.confirmLabel}
        </button>
      </div>
    </dialog>
  );
}

export function Pager(props: {
  page: number;
  hasNext: boolean;
  onPrev: () => void;
  onNext: () => void;
}) {
  return (
    <div class="pager">
      <button type="button" disabled={props.page === 0} onClick={props.onPrev} data-testid="prev">
        ← Previous
      </button>
      <span>page {props.page + 1}</span>
      <button type="button" disabled={!props.hasNext} onClick={props.onNext} data-testid="next">
        Next →
      </button>
    </div>
  );
}

/** Polls `f` every `ms` while mounted (first call at once); skips a tick while one runs. */
export function usePoll(f: () => Promise<void>, ms: number, deps: unknown[]) {
  useEffect(() => {
    let stopped = false;
    let running = false;
    const tick = async () => {
      if (running || stopped) return;
      running = true;
      try {
        await f();
      } finally {
        running = false;
      }
    };
    tick();
    const t = setInterval(tick, ms);
    return () => {
      stopped = true;
      clearInterval(t);
    };
  }, deps);
}
